"""CachedPool: a results store in front of any pool (LocalPool, RayPool, a service client).

Why a wrapper and not a feature of each pool: one mechanism serves every pool the same way. A
(task, solution) already evaluated on this device (same library versions) is answered from the
store without touching a worker; a miss goes to the pool, and its result is committed to the
store before the caller's future resolves, so a run killed at any point restarts with every
finished evaluation in the store. Identical (task, solution) pairs submitted while one is in
flight share that one evaluation (RL groups often repeat a completion).

Failures that are not verdicts on the solution - a ``harness_error`` (already retried once by
the pool behind) or a failure of the pool itself - are stored for the record but never served
(``store.is_cacheable``): the next submission of that pair is evaluated again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any, Protocol

from kernelrl.env.result import EvalResult
from kernelrl.env.store import ResultsStore, solution_key
from kernelrl.env.submit_api import EvaluateFromSubmit
from kernelrl.env.task import Task

log = logging.getLogger(__name__)


class Pool(Protocol):
    """What kernelrl expects of an evaluation pool."""

    def submit(
        self, tasks: Sequence[Task], solutions: Sequence[str]
    ) -> list[Future[EvalResult]]: ...

    def close(self) -> None: ...


def pool_identity(pool: Any) -> tuple[str, dict[str, str] | None]:
    """Device name and library versions of the workers behind ``pool``."""
    name = getattr(pool, "device_name", None)
    versions = getattr(pool, "versions", None)
    evaluators = getattr(pool, "evaluators", None)  # LocalPool
    if name is None and evaluators:
        name, versions = evaluators[0].device_name, evaluators[0].versions
    if name is None:
        raise ValueError(
            f"cannot tell which device {type(pool).__name__} evaluates on; pass device_name"
        )
    return name, versions


class CachedPool(EvaluateFromSubmit):
    def __init__(
        self,
        pool: Pool,
        store: ResultsStore,
        device_name: str | None = None,
        versions: dict[str, str] | None = None,
        match_versions: bool = True,
    ) -> None:
        """``device_name``/``versions`` default to those of the pool's workers; results from
        other library versions are not reused unless ``match_versions`` is False."""
        self.pool = pool
        self.store = store
        if device_name is None:
            device_name, pool_versions = pool_identity(pool)
            versions = versions or pool_versions
        self.device_name = device_name
        self.versions = versions if match_versions else None
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()
        self._in_flight: dict[tuple[str, str, str], list[Future[EvalResult]]] = {}

    @property
    def num_slots(self) -> int:
        return int(getattr(self.pool, "num_slots", 1))

    def submit(
        self, tasks: Sequence[Task], solutions: Sequence[str], timeout_s: float | None = None
    ) -> list[Future[EvalResult]]:
        """``timeout_s``: batch deadline, for pools that take one (RayPool, a service)."""
        if len(tasks) != len(solutions):
            raise ValueError(f"{len(tasks)} tasks but {len(solutions)} solutions")
        futures: list[Future[EvalResult]] = []
        misses: list[tuple[Task, str, tuple[str, str, str]]] = []
        for task, solution in zip(tasks, solutions, strict=True):
            future: Future[EvalResult] = Future()
            futures.append(future)
            cached = self.store.get(task, solution, self.device_name, self.versions)
            if cached is not None:
                self.hits += 1
                future.set_result(cached)
                continue
            key = (task.hash, task.backend, solution_key(solution))
            with self._lock:
                waiting = self._in_flight.get(key)
                if waiting is not None:  # the same pair is being evaluated: share it
                    self.hits += 1
                    waiting.append(future)
                    continue
                self._in_flight[key] = [future]
                self.misses += 1
            misses.append((task, solution, key))
        if misses:
            args = ([m[0] for m in misses], [m[1] for m in misses])
            kwargs = {} if timeout_s is None else {"timeout_s": timeout_s}
            inner = self.pool.submit(*args, **kwargs)
            for (task, solution, key), inner_future in zip(misses, inner, strict=True):
                inner_future.add_done_callback(
                    lambda done, t=task, s=solution, k=key: self._finish(t, s, k, done)
                )
        return futures

    def _finish(self, task: Task, solution: str, key: tuple[str, str, str], done: Future) -> None:
        error = done.exception()
        if error is None:
            result = done.result()
            try:
                self.store.put(task, solution, result)  # committed before anyone sees it
            except Exception:  # a full disk must not lose the evaluation itself
                log.exception("could not store the result of %s", task.id)
        with self._lock:
            waiting = self._in_flight.pop(key, [])
        for future in waiting:
            if not future.set_running_or_notify_cancel():
                continue
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> CachedPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
