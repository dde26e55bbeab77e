"""CachedPool: a results store in front of any pool (LocalPool, RayPool, a service client).

Why a wrapper and not a feature of each pool: one mechanism serves every pool the same way. A
(task, solution) already judged exactly as this pool would judge it (``env/verdict_key.py``: the
task's source, tolerances, sizes and backend, the device, library versions, the pool's
evaluation settings and the environment's code) is answered from the store without touching a
worker; a miss goes to the pool, and its result is committed to the store before the caller's
future resolves, so a run killed at any point restarts with every finished evaluation in the
store. Identical pairs submitted while one is in flight share that one evaluation (RL groups
often repeat a completion).

Failures that are not verdicts on the solution - a ``harness_error`` (already retried once by
the pool behind) or a failure of the pool itself - are stored for the record but never served
(``store.is_cacheable``): the next submission of that pair is evaluated again.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import CancelledError, Future
from typing import TYPE_CHECKING

from kernelrl.env.pools.base import Pool, SubmitPool, check_batch, settle
from kernelrl.env.result import EvalResult
from kernelrl.env.store import ResultsStore
from kernelrl.env.task import Task
from kernelrl.env.verdict_key import VerdictContext, verdict_key

if TYPE_CHECKING:
    from kernelrl.env.evaluator import EvalConfig

log = logging.getLogger(__name__)


class CachedPool(SubmitPool):
    def __init__(self, pool: Pool, store: ResultsStore, config: EvalConfig | None = None) -> None:
        """``config``: the ``EvalConfig`` the pool evaluates with (default: the pool's own
        ``config``, as ``LocalPool`` and ``RayPool`` keep it); its settings are part of every
        key, so a pool without one is refused rather than keyed as if it had none."""
        config = config if config is not None else getattr(pool, "config", None)
        if config is None:
            raise ValueError(
                f"CachedPool needs the EvalConfig that {type(pool).__name__} evaluates with"
                " (its settings decide verdicts): pass config="
            )
        self.pool = pool
        self.store = store
        self.device = pool.device
        self.device_name = pool.device_name
        self.versions = dict(pool.versions)
        self.context = VerdictContext.of(pool, config)
        self.hits = 0
        self.misses = 0
        self._lock = threading.RLock()
        self._in_flight: dict[str, list[tuple[Future[EvalResult], str]]] = {}
        self._inner: dict[str, Future[EvalResult]] = {}

    @property
    def num_slots(self) -> int:
        return self.pool.num_slots

    def submit(
        self, tasks: Sequence[Task], solutions: Sequence[str], timeout_s: float | None = None
    ) -> list[Future[EvalResult]]:
        """``timeout_s``: batch deadline, passed to the pool behind. Cancelling a returned
        future cancels the evaluation behind it when no other caller waits for the same pair."""
        check_batch(tasks, solutions)
        futures: list[Future[EvalResult]] = []
        misses: list[tuple[Task, str, str]] = []
        waiters: list[tuple[str, Future[EvalResult]]] = []
        for task, solution in zip(tasks, solutions, strict=True):
            future: Future[EvalResult] = Future()
            futures.append(future)
            cached = self.store.get(task, solution, self.context)
            if cached is not None:
                self.hits += 1
                future.set_result(_as_asked(cached, task.id))
                continue
            key = verdict_key(task, solution, self.context)
            with self._lock:
                waiting = self._in_flight.get(key)
                if waiting is not None:  # the same pair is being evaluated: share it
                    self.hits += 1
                    waiting.append((future, task.id))
                    waiters.append((key, future))
                    continue
                # Looked up again under the lock: an evaluation of this pair that finished
                # since the first look is in the store now (``_finish`` writes it before it
                # leaves ``_in_flight``), and a second one would record the pair twice.
                cached = self.store.get(task, solution, self.context)
                if cached is not None:
                    self.hits += 1
                    future.set_result(_as_asked(cached, task.id))
                    continue
                self._in_flight[key] = [(future, task.id)]
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

    def _abandoned(self, key: str, done: Future) -> None:
        """A caller cancelled its future (an HTTP client went away): when nobody else waits
        for the same pair, the evaluation behind is cancelled too (the pool drops it unless a
        worker runs it already; then it finishes and is stored, for the next asker)."""
        if not done.cancelled():
            return
        with self._lock:  # held while cancelling: nobody joins a pair being given up
            waiting = self._in_flight.get(key, [])
            inner = self._inner.get(key)
            if inner is not None and all(f.cancelled() for f, _ in waiting):
                inner.cancel()  # runs _finish here (re-entrant lock) when it succeeds

    def _finish(self, task: Task, solution: str, key: str, done: Future) -> None:
        result = None
        if done.cancelled():  # every waiter gave up (``_abandoned``): nothing to store
            error: BaseException | None = CancelledError()
        else:
            error = done.exception()
        if error is None:
            result = done.result()
            try:
                self.store.put(task, solution, result, self.context)  # before anyone sees it
            except Exception:  # a full disk must not lose the evaluation itself
                log.exception("could not store the result of %s", task.id)
        with self._lock:
            waiting = self._in_flight.pop(key, [])
            self._inner.pop(key, None)
        for future, task_id in waiting:
            settle(future, _as_asked(result, task_id) if result is not None else None, error)

    def close(self) -> None:
        self.pool.close()


def _as_asked(result: EvalResult, task_id: str) -> EvalResult:
    """The result under the id of the task that asked: keys are contents, and two tasks of
    the same contents (a sweep's duplicates) each get their own name back."""
    return result if result.task_id == task_id else dataclasses.replace(result, task_id=task_id)
