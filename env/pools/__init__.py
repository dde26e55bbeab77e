"""Evaluation pools: one contract (``Pool``), several places to evaluate.

- ``base``: the ``Pool`` protocol every pool implements and every caller types against.
- ``factory``: ``make_pool`` / ``EnvPoolConfig``, a pool by name (``local``, ``ray``, ``service``).
- ``local``: ``LocalPool``, sandboxed subprocesses on this machine.
- ``ray``: ``RayPool``, evaluation actors on a Ray cluster's GPUs (``ray_workers``: the actors).
- ``scheduler``: longest-first dispatch and blame isolation, pure (no Ray), for ``RayPool``;
  its cost model orders ``LocalPool``'s batches too.
- ``cached``: ``CachedPool``, a results store in front of any pool.
- ``verdicts``: harness-error retry and the verdicts a pool gives itself.
- ``service``: ``ServiceClient``, a running ``kernelrl env serve`` shared with other jobs.
"""

from kernelrl.env.pools.base import EVALS_PER_GPU, Pool
from kernelrl.env.pools.factory import POOL_KINDS, EnvPoolConfig, make_pool

__all__ = ["EVALS_PER_GPU", "POOL_KINDS", "Pool", "EnvPoolConfig", "make_pool"]
