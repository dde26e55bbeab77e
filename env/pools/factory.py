"""Build the environment pool a job evaluates with, by name: one mechanism for training, sweeps
and curation.

``local``: sandboxed subprocesses on this machine (its GPUs, or CPU slots); ``ray``: evaluation
actors on the GPUs of a Ray cluster (a local Ray with logical GPUs when none is given and there is
no GPU); ``service``: a running ``kernelrl env serve`` shared with other jobs. With
``store_path`` a results store sits in front (``CachedPool``), so a completion already evaluated
on this device with these library versions is not evaluated again; a service has its own store.

The pool modules are imported only for the kind asked for: choosing a pool in a recipe must not
import torch or Ray.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kernelrl.env.pools.base import EVALS_PER_GPU, Pool

if TYPE_CHECKING:
    from kernelrl.env.evaluator import EvalConfig

POOL_KINDS = ("local", "ray", "service")


def make_pool(
    kind: str,
    config: EvalConfig,
    *,
    workers: int | None = None,
    per_gpu: int = EVALS_PER_GPU,
    ray_address: str | None = None,
    service_name: str = "kernelrl-env",
    store_path: str | None = None,
) -> Pool:
    """A pool of kind ``kind``. ``workers``: CPU slots or GPUs (local), GPU actors (ray); None
    for all."""
    pool: Pool
    if kind == "local":
        from kernelrl.env.pools.local import LocalPool

        pool = LocalPool(config, workers=workers, per_gpu=per_gpu)
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
        from kernelrl.env.service import ServiceClient

        return ServiceClient(name=service_name, address=ray_address or "auto")
    else:
        raise ValueError(f"the environment pool must be one of {POOL_KINDS}, got {kind!r}")
    if not store_path:
        return pool
    from kernelrl.env.pools.cached import CachedPool
    from kernelrl.env.store import ResultsStore

    return CachedPool(pool, ResultsStore(store_path))


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
    ) -> Pool:
        return make_pool(
            self.pool,
            config,
            workers=workers,
            ray_address=self.ray_address,
            service_name=self.service_name,
            store_path=store_path,
        )
