"""The pool contract: what every evaluation pool offers and every caller types against.

A pool evaluates (task, solution) pairs somewhere - subprocesses on this machine
(``LocalPool``), actors on a Ray cluster (``RayPool``), a shared service (``ServiceClient``),
a results store in front of another pool (``CachedPool``) - and all of them answer the same
calls the same way, so a trainer, a sweep or a curation step never needs to know which it has.

Kept free of torch and Ray: importing the contract (or the pool names in recipes) is cheap.
"""

from __future__ import annotations

import asyncio
import copy
from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import Future, InvalidStateError
from typing import TYPE_CHECKING, Any, Protocol, Self, runtime_checkable

from kernelrl.env.pools.sizing import AUTO
from kernelrl.env.result import EvalResult
from kernelrl.env.task import Task

if TYPE_CHECKING:
    from kernelrl.env.evaluator import EvalConfig

# Evaluations in flight on one GPU: they compile and check in parallel and take turns for the
# GPU-exclusive measurement. By default sized from the host each GPU is on (``sizing``: 16 on
# a 16-core H100 host), which every pool does where its GPUs are.
EVALS_PER_GPU = AUTO


@runtime_checkable
class Pool(Protocol):
    """An evaluation pool.

    ``submit`` is the one primitive: one future per (task, solution), in input order, resolved
    with an EvalResult or with the TaskError of a broken task; it blocks while the pool's queue
    is full (backpressure). ``timeout_s`` is a deadline for the batch: what is not done by then
    is answered by the pool itself (marked ``sandbox["pool_error"]``). ``device_name`` and
    ``versions`` say where results come from (a results store keys on them)."""

    device: str
    device_name: str
    versions: dict[str, str]

    @property
    def num_slots(self) -> int: ...

    def submit(
        self, tasks: Sequence[Task], solutions: Sequence[str], timeout_s: float | None = None
    ) -> list[Future[EvalResult]]: ...

    def evaluate(
        self, tasks: Sequence[Task], solutions: Sequence[str], timeout_s: float | None = None
    ) -> list[EvalResult]: ...

    async def aevaluate(
        self, tasks: Sequence[Task], solutions: Sequence[str], timeout_s: float | None = None
    ) -> list[EvalResult]: ...

    def close(self) -> None: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> None: ...


class SubmitPool(ABC):
    """``evaluate``, ``aevaluate`` and the context manager, derived from ``submit``: every pool
    inherits them, so the blocking and async forms cannot drift apart from ``submit``."""

    @abstractmethod
    def submit(
        self, tasks: Sequence[Task], solutions: Sequence[str], timeout_s: float | None = None
    ) -> list[Future[EvalResult]]: ...

    @abstractmethod
    def close(self) -> None: ...

    def evaluate(
        self, tasks: Sequence[Task], solutions: Sequence[str], timeout_s: float | None = None
    ) -> list[EvalResult]:
        """Blocks until every result is in; results in input order."""
        return [future.result() for future in self.submit(tasks, solutions, timeout_s)]

    async def aevaluate(
        self, tasks: Sequence[Task], solutions: Sequence[str], timeout_s: float | None = None
    ) -> list[EvalResult]:
        """The same without blocking the event loop (``submit`` may block on backpressure)."""
        futures = await asyncio.to_thread(self.submit, tasks, solutions, timeout_s)
        return list(await asyncio.gather(*(asyncio.wrap_future(f) for f in futures)))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_batch(tasks: Sequence[Task], solutions: Sequence[str]) -> None:
    if len(tasks) != len(solutions):
        raise ValueError(f"{len(tasks)} tasks but {len(solutions)} solutions")


def settle(
    future: Future, result: EvalResult | None = None, error: BaseException | None = None
) -> bool:
    """Resolve ``future`` unless something resolved (or cancelled) it first - a deadline, a
    close, the caller: False then, and the late answer is dropped. Safe from any thread."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:
        return False
    return True


def own_config(config: EvalConfig, spare_children: int) -> EvalConfig:
    """A pool's private copy of the caller's config, with at least ``spare_children`` sandbox
    children kept warm: the caller's object is never changed (it may configure other pools)."""
    owned = copy.deepcopy(config)
    owned.spare_children = max(owned.spare_children, spare_children)
    return owned
