"""The environment pool a training run gets its rewards from, built from the recipe.

``local``: sandboxed subprocesses on this machine (its GPUs, or CPU slots); ``ray``: evaluation
actors on the GPUs of a Ray cluster; ``service``: a running ``kernelrl env serve`` shared with
other jobs (the multi-node setup: the environment has its own GPU nodes). With
``env_store_path`` a results store sits in front, so identical completions are evaluated once.
"""

from __future__ import annotations

from typing import Any

from kernelrl.env.evaluator import EvalConfig


def make_pool(args: Any) -> Any:
    """A pool with the ``submit(tasks, solutions) -> futures`` and ``close()`` contract."""
    config = EvalConfig(device=args.env_device, timeout_s=args.env_timeout_s)
    if args.env_pool == "local":
        from kernelrl.env.pool import LocalPool

        pool: Any = LocalPool(config, workers=args.env_workers, per_gpu=args.env_per_gpu)
        identity = (pool.evaluators[0].device_name, pool.evaluators[0].versions)
    elif args.env_pool == "ray":
        from kernelrl.env.ray_pool import RayPool

        pool = RayPool(
            config,
            workers=args.env_workers,
            per_gpu=args.env_per_gpu,
            address=args.env_ray_address,
            store_path=args.env_store_path,
        )
        identity = (pool.device_name, pool.versions)
    elif args.env_pool == "service":
        from kernelrl.env.service import ServiceClient

        pool = ServiceClient(name=args.env_service_name, address=args.env_ray_address or "auto")
        identity = (pool.device_name, pool.versions)
    else:
        raise ValueError(f"env_pool must be local, ray or service, got {args.env_pool!r}")
    if args.env_store_path and args.env_pool != "service":  # a service has its own store
        from kernelrl.env.cached_pool import CachedPool
        from kernelrl.env.store import ResultsStore

        pool = CachedPool(
            pool, ResultsStore(args.env_store_path), device_name=identity[0], versions=identity[1]
        )
    return pool
