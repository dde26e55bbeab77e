"""Build the environment pool a job evaluates with, by name: one mechanism for training, sweeps
and curation.

``local``: sandboxed subprocesses on this machine (its GPUs, or CPU slots); ``ray``: evaluation
actors on the GPUs of a Ray cluster (a local Ray with logical GPUs when none is given and there is
no GPU); ``service``: a running ``kernelrl env serve`` shared with other jobs. With
``store_path`` a results store sits in front (``CachedPool``), so a completion already evaluated
on this device with these library versions is not evaluated again; a service has its own store.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # importing this module (a default, the pool names) must not import torch
    from kernelrl.env.evaluator import EvalConfig

POOL_KINDS = ("local", "ray", "service")
# Evaluations in flight on one GPU: they compile and check in parallel and take turns for the
# GPU-exclusive measurement. 4 gave 50.6 evaluations/min on one H100 (benchmarks/README.md).
EVALS_PER_GPU = 4


def make_pool(
    kind: str,
    config: EvalConfig,
    *,
    workers: int | None = None,
    per_gpu: int = EVALS_PER_GPU,
    ray_address: str | None = None,
    service_name: str = "kernelrl-env",
    store_path: str | None = None,
) -> Any:
    """A pool with the ``submit(tasks, solutions) -> futures``, ``evaluate`` and ``close()``
    contract. ``workers``: CPU slots or GPUs (local), GPU actors (ray); None for all."""
    if kind == "local":
        from kernelrl.env.pool import LocalPool

        pool: Any = LocalPool(config, workers=workers, per_gpu=per_gpu)
        identity = (pool.evaluators[0].device_name, pool.evaluators[0].versions)
    elif kind == "ray":
        from kernelrl.env.ray_pool import RayPool

        pool = RayPool(
            config,
            workers=workers,
            per_gpu=per_gpu,
            address=ray_address or None,
            store_path=store_path or None,
        )
        identity = (pool.device_name, pool.versions)
    elif kind == "service":
        from kernelrl.env.service import ServiceClient

        pool = ServiceClient(name=service_name, address=ray_address or "auto")
        return pool
    else:
        raise ValueError(f"the environment pool must be one of {POOL_KINDS}, got {kind!r}")
    if not store_path:
        return pool
    from kernelrl.env.cached_pool import CachedPool
    from kernelrl.env.store import ResultsStore

    return CachedPool(pool, ResultsStore(store_path), device_name=identity[0], versions=identity[1])


@dataclass
class PoolChoice:
    """The recipe keys that choose a job's pool (eval sweeps and curation inherit them)."""

    pool: str = field(
        default="local",
        metadata={
            "help": "environment pool: local, ray (actors on a Ray cluster's GPUs) or service"
        },
    )
    ray_address: str = field(default="", metadata={"help": "Ray cluster to join (ray, service)"})
    service_name: str = field(
        default="kernelrl-env", metadata={"help": "name of a running `kernelrl env serve`"}
    )

    def __post_init__(self) -> None:
        if self.pool not in POOL_KINDS:
            raise ValueError(f"pool must be one of {POOL_KINDS}, got {self.pool!r}")

    def build_pool(
        self, config: EvalConfig, *, workers: int | None = None, store_path: str | None = None
    ) -> Any:
        return make_pool(
            self.pool,
            config,
            workers=workers,
            ray_address=self.ray_address,
            service_name=self.service_name,
            store_path=store_path,
        )
