"""Build the environment pool a job evaluates with, by name: one mechanism for training, sweeps
and curation.

``local``: sandboxed subprocesses on this machine (its GPUs, or CPU slots); ``ray``: evaluation
actors on the GPUs of a Ray cluster (a local Ray with logical GPUs when none is given and there is
no GPU); ``service``: a running ``kernelrl env serve`` shared with other jobs. With
``store_path`` a results store sits in front (``CachedPool``), so a completion already judged
exactly as this pool would judge it (the task's tolerances and sizes, this device, these library
versions, the pool's evaluation settings, this code: ``env/verdict_key.py``) is not evaluated
again; a service has its own store.

The pool modules are imported only for the kind asked for: choosing a pool in a recipe must not
import torch or Ray.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from kernelrl.env.pools.base import EVALS_PER_GPU, Pool

if TYPE_CHECKING:
    from kernelrl.env.evaluator import EvalConfig

POOL_KINDS = ("local", "process", "ray", "service")
#: the pools whose sandboxed children run on this host, under this process or a child of it
HOST_POOL_KINDS = ("local", "process")


def make_pool(
    kind: str,
    config: EvalConfig,
    *,
    workers: int | None = None,
    per_gpu: int = EVALS_PER_GPU,
    ray_address: str | None = None,
    service_name: str = "kernelrl-env",
    store_path: str | None = None,
    gpus: Sequence[int] | None = None,
) -> Pool:
    """A pool of kind ``kind``. ``workers``: CPU slots or GPUs (local), GPU actors (ray); None
    for all. ``gpus``: for a local GPU pool, the GPUs of this process's share of the host
    (``LocalPool``); other pools place their own evaluations."""
    pool: Pool
    if kind == "local":
        from kernelrl.env.pools.local import LocalPool

        pool = LocalPool(config, workers=workers, per_gpu=per_gpu, gpus=gpus)
    elif kind == "process":
        from kernelrl.env.pools.process import ProcessPool

        pool = ProcessPool(config, workers=workers, per_gpu=per_gpu, gpus=gpus)
    elif kind == "ray":
        from kernelrl.env.pools.ray import RayPool

        pool = RayPool(
            config,
            workers=workers,
            per_gpu=per_gpu,
            address=ray_address or None,
            store_path=store_path or None,
        )
    elif kind == "service":
        from kernelrl.env.pools.service import ServiceClient

        return ServiceClient(name=service_name, address=ray_address or "auto")
    else:
        raise ValueError(f"the environment pool must be one of {POOL_KINDS}, got {kind!r}")
    if not store_path:
        return pool
    from kernelrl.env.pools.cached import CachedPool
    from kernelrl.env.store import ResultsStore

    return CachedPool(pool, ResultsStore(store_path), config)  # its settings are keyed


@dataclass
class EnvPoolConfig:
    """The environment pool a job evaluates with: the same keys, parsed the same way, in
    training, evaluation sweeps, curation and synthetic-task recipes (training parses it next
    to its other parts; the sweep, curation and synthesis configs extend it)."""

    #: Keys of sweep and curation recipes before there was one pool config (old -> new): a
    #: recipe that still sets one is refused with a one-line error naming the new key.
    RENAMED_KEYS: ClassVar[dict[str, str]] = {
        "pool": "env_pool",
        "device": "env_device",
        "eval_workers": "env_workers",
        "eval_timeout_s": "env_timeout_s",
        "cache_db": "env_store_path",
        "ray_address": "env_ray_address",
        "service_name": "env_service_name",
    }

    env_pool: str = field(
        default="local",
        metadata={
            "help": "'local' (subprocesses here), 'process' (the same in a process of its "
            "own, off the caller's interpreter: for async_generation), 'ray' (actors on the "
            "cluster's GPUs) or 'service' (a running `kernelrl env serve`)"
        },
    )
    env_device: str = field(default="auto", metadata={"help": "cpu, cuda or auto"})
    env_workers: int | None = field(
        default=None, metadata={"help": "CPU slots or GPUs of the pool (default: all)"}
    )
    env_per_gpu: int = field(
        default=EVALS_PER_GPU,
        metadata={
            "help": "evaluations in flight per GPU; 0 sizes them from the cores and memory of "
            "each GPU's host"
        },
    )
    env_timeout_s: float = field(default=180.0, metadata={"help": "seconds for one evaluation"})
    env_time_reference_compile: bool = field(
        default=True,
        metadata={
            "help": "time the torch.compile baseline too (GPU; reported, not rewarded: off "
            "spares RL a compile of every new task's reference)"
        },
    )
    env_cache_reference_timing: bool = field(
        default=True,
        metadata={
            "help": "reuse a task's reference timing; off, each evaluation times its reference "
            "interleaved with the solution's input sets in one exclusive window (side by side, "
            "slower)"
        },
    )
    env_move_local_memory: bool = field(
        default=True,
        metadata={
            "help": "GPU: a spilling solution's local memory (spilled registers) allocated "
            "anew before each input set, so its time is drawn per set, not once per "
            "evaluation (narrower speed-ups between evaluations; only where the solution's "
            "first call needed local memory; docs/decisions.md)"
        },
    )
    env_compile_ahead: bool = field(
        default=False,
        metadata={
            "help": "compile each Triton solution's kernels in a companion sandbox without a "
            "GPU, which measurements never pause (GPU; off by default: not faster at the sized "
            "slots, docs/decisions.md)"
        },
    )
    env_admission_in_order: bool = field(
        default=True,
        metadata={
            "help": "GPU memory admitted to waiting evaluations in the order they asked; off, "
            "to whichever fits (fuller GPU, but a large task can wait while smaller ones pass "
            "it; docs/decisions.md)"
        },
    )
    env_admission_backfill: bool = field(
        default=False,
        metadata={
            "help": "in order, a later evaluation may start first where it fits beside the "
            "earliest waiting one's plan, which then waits only for those that asked before it "
            "(off by default: not yet measured on a GPU; docs/decisions.md)"
        },
    )
    env_ray_address: str | None = field(
        default=None, metadata={"help": "Ray cluster to join (ray/service pools)"}
    )
    env_service_name: str = field(
        default="kernelrl-env", metadata={"help": "name of the environment service"}
    )
    env_store_path: str | None = field(
        default=None,
        metadata={"help": "results store (SQLite) shared across runs: a solution seen is reused"},
    )

    def __post_init__(self) -> None:
        if self.env_pool not in POOL_KINDS:
            raise ValueError(f"env_pool must be one of {POOL_KINDS}, got {self.env_pool!r}")

    def times_on_local_gpus(self) -> bool:
        """Whether this pool times kernels on this machine's GPUs, which the model of the same
        process (a policy being trained, an in-process client) also uses."""
        from kernelrl.env.evaluator import resolve_device

        if self.env_pool not in HOST_POOL_KINDS:
            return False
        return self.env_device == "cuda" or resolve_device(self.env_device) == "cuda"

    def make_pool(self, gpus: Sequence[int] | None = None) -> Pool:
        """The pool these keys describe (the caller closes it); ``gpus`` as in ``make_pool``."""
        from kernelrl.env.evaluator import EvalConfig
        from kernelrl.env.timing import TimingConfig

        return make_pool(
            self.env_pool,
            EvalConfig(
                device=self.env_device,
                timeout_s=self.env_timeout_s,
                time_reference_compile=self.env_time_reference_compile,
                cache_reference_timing=self.env_cache_reference_timing,
                compile_ahead=self.env_compile_ahead,
                admission_in_order=self.env_admission_in_order,
                admission_backfill=self.env_admission_backfill,
                timing=TimingConfig(move_local_memory=self.env_move_local_memory),
            ),
            workers=self.env_workers or None,
            per_gpu=self.env_per_gpu,
            ray_address=self.env_ray_address,
            service_name=self.env_service_name,
            store_path=self.env_store_path,
            gpus=gpus,
        )
