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
from concurrent.futures import CancelledError, Future

from kernelrl.env.pools.base import Pool, SubmitPool, check_batch, settle
from kernelrl.env.result import EvalResult
from kernelrl.env.store import ResultsStore, solution_key
from kernelrl.env.task import Task

log = logging.getLogger(__name__)


class CachedPool(SubmitPool):
    def __init__(self, pool: Pool, store: ResultsStore, match_versions: bool = True) -> None:
        """Results of the pool's device are reused; those of other library versions only when
        ``match_versions`` is False."""
        self.pool = pool
        self.store = store
        self.device = pool.device
        self.device_name = pool.device_name
        self.versions = dict(pool.versions)
        self._match_versions = match_versions
        self.hits = 0
        self.misses = 0
        self._lock = threading.RLock()
        self._in_flight: dict[tuple[str, str, str], list[Future[EvalResult]]] = {}
        self._inner: dict[tuple[str, str, str], Future[EvalResult]] = {}

    @property
    def num_slots(self) -> int:
        return self.pool.num_slots

    def submit(
        self, tasks: Sequence[Task], solutions: Sequence[str], timeout_s: float | None = None
    ) -> list[Future[EvalResult]]:
        """``timeout_s``: batch deadline, passed to the pool behind. Cancelling a returned
        future cancels the evaluation behind it when no other caller waits for the same pair."""
        check_batch(tasks, solutions)
        versions = self.versions if self._match_versions else None
        futures: list[Future[EvalResult]] = []
        misses: list[tuple[Task, str, tuple[str, str, str]]] = []
        waiters: list[tuple[tuple[str, str, str], Future[EvalResult]]] = []
        for task, solution in zip(tasks, solutions, strict=True):
            future: Future[EvalResult] = Future()
            futures.append(future)
            cached = self.store.get(task, solution, self.device_name, versions)
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
                    waiters.append((key, future))
                    continue
                # Looked up again under the lock: an evaluation of this pair that finished
                # since the first look is in the store now (``_finish`` writes it before it
                # leaves ``_in_flight``), and a second one would record the pair twice.
                cached = self.store.get(task, solution, self.device_name, versions)
                if cached is not None:
                    self.hits += 1
                    future.set_result(cached)
                    continue
                self._in_flight[key] = [future]
                self.misses += 1
            misses.append((task, solution, key))
            waiters.append((key, future))
        if misses:
            inner = self.pool.submit([m[0] for m in misses], [m[1] for m in misses], timeout_s)
            for (task, solution, key), inner_future in zip(misses, inner, strict=True):
                with self._lock:
                    if key in self._in_flight:
                        self._inner[key] = inner_future
                inner_future.add_done_callback(
                    lambda done, t=task, s=solution, k=key: self._finish(t, s, k, done)
                )
        for key, future in waiters:  # after _inner is known: a waiter cancelled already counts
            future.add_done_callback(lambda done, k=key: self._abandoned(k, done))
        return futures

    def _abandoned(self, key: tuple[str, str, str], done: Future) -> None:
        """A caller cancelled its future (an HTTP client went away): when nobody else waits
        for the same pair, the evaluation behind is cancelled too (the pool drops it unless a
        worker runs it already; then it finishes and is stored, for the next asker)."""
        if not done.cancelled():
            return
        with self._lock:  # held while cancelling: nobody joins a pair being given up
            waiting = self._in_flight.get(key, [])
            inner = self._inner.get(key)
            if inner is not None and all(f.cancelled() for f in waiting):
                inner.cancel()  # runs _finish here (re-entrant lock) when it succeeds

    def _finish(self, task: Task, solution: str, key: tuple[str, str, str], done: Future) -> None:
        result = None
        if done.cancelled():  # every waiter gave up (``_abandoned``): nothing to store
            error: BaseException | None = CancelledError()
        else:
            error = done.exception()
        if error is None:
            result = done.result()
            try:
                self.store.put(task, solution, result)  # committed before anyone sees it
            except Exception:  # a full disk must not lose the evaluation itself
                log.exception("could not store the result of %s", task.id)
        with self._lock:
            waiting = self._in_flight.pop(key, [])
            self._inner.pop(key, None)
        for future in waiting:
            settle(future, result, error)

    def close(self) -> None:
        self.pool.close()
