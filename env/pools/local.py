"""LocalPool: the embedded evaluation pool (this machine's GPUs, or CPU slots).

Every evaluation runs its solution in a fresh sandboxed child, so a crashing or hanging solution
costs one child, never a slot. Submission blocks when ``max_pending`` evaluations are queued
(backpressure for trainers that produce faster than the GPUs evaluate). Batches are served in
submission order and each batch longest-first, as the Ray pool does (``CostModel``: a task's
measured seconds, else its source size), so a batch does not end on one long evaluation while
the other slots stand idle. A ``harness_error`` is evaluated once more in a fresh child
(``verdicts.retried_harness_error``), as in every pool.

A batch deadline (``submit(..., timeout_s=)``) answers what is not done by then: an evaluation
still running as ``timeout`` (its slot finishes it and the late verdict is dropped), one that
never started as a ``harness_error`` (nothing was learnt about the solution).
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from kernelrl.env.evaluator import EvalConfig, Evaluator
from kernelrl.env.pools.base import SubmitPool, check_batch, own_config, settle
from kernelrl.env.pools.scheduler import CostModel
from kernelrl.env.pools.sizing import AUTO, HostResources, Sizing, check_per_gpu, size_gpu_pool
from kernelrl.env.pools.verdicts import (
    first_line,
    is_harness_error,
    pool_result,
    retried_harness_error,
)
from kernelrl.env.result import EvalResult, Status
from kernelrl.env.task import Task

log = logging.getLogger(__name__)

_STOP = object()


def evaluate_retrying_harness_errors(evaluator: Evaluator, task: Task, solution: str) -> EvalResult:
    """One evaluation, repeated once (a fresh child) when the harness failed."""
    result = evaluator.evaluate(task, solution)
    if not is_harness_error(result):
        return result
    log.warning("harness_error on %s, evaluating once more: %s", task.id, first_line(result.error))
    return retried_harness_error(result, evaluator.evaluate(task, solution))


@dataclass(eq=False)
class _Item:
    task: Task
    solution: str
    future: Future
    submitted: float


class LocalPool(SubmitPool):
    def __init__(
        self,
        config: EvalConfig | None = None,
        workers: int | None = None,
        per_gpu: int = AUTO,
        max_pending: int = 1024,
        spares: int | None = None,
        gpus: Sequence[int] | None = None,
    ) -> None:
        """``workers``: CPU slots, or GPUs to use; ``per_gpu``: evaluations in flight per GPU
        (they compile and check in parallel; the measurement itself is exclusive), ``AUTO`` (0)
        to size them from the host's cores and memory (``sizing.size_gpu_pool``);
        ``spares``: children kept warming per GPU (default: sized likewise).

        ``gpus``: the GPUs to evaluate on where this process shares the host's GPUs with
        others, one per trainer rank: each rank times kernels on its own GPU only (never on
        another rank's policy), and each GPU is sized as its share of the host's cores, the
        others' shares belonging to the other processes. Default: the first ``workers``."""
        check_per_gpu(per_gpu)
        config = config or EvalConfig()
        self.sizing: Sizing | None = None
        if config.resolved_device() == "cuda":
            count = torch.cuda.device_count()
            if gpus is None:
                indices = list(range(count if workers is None else min(workers, count)))
                sharing = len(indices)
            else:
                indices = sorted(set(gpus))
                if not indices or not all(0 <= i < count for i in indices):
                    raise ValueError(f"gpus {list(gpus)} are not among this host's {count} GPUs")
                sharing = count
            host = HostResources.detect(
                sharing, torch.cuda.get_device_properties(indices[0]).total_memory if indices else 0
            )
            sizing = size_gpu_pool(host, per_gpu)
            if spares is not None:
                sizing = Sizing(sizing.per_gpu, spares, sizing.why + "; spares given")
            self.sizing = sizing
            self.config = own_config(config, sizing.spares)
            self.evaluators = [Evaluator(self.config, gpu_index=i) for i in indices]
            slots = [ev for ev in self.evaluators for _ in range(sizing.per_gpu)]
            log.info("LocalPool: GPU(s) %s, %s (%s)", indices, sizing, sizing.why)
        else:
            count = workers or max(os.cpu_count() or 1, 1)
            self.config = own_config(config, spares if spares is not None else count)
            self.evaluators = [Evaluator(self.config)]
            slots = [self.evaluators[0]] * count
        first = self.evaluators[0]
        self.device, self.device_name, self.versions = (
            first.device_kind,
            first.device_name,
            first.versions,
        )
        # Entries (batch, -expected seconds, ticket, item): the ticket orders ties and keeps
        # items from being compared.
        self._queue: queue.PriorityQueue = queue.PriorityQueue(maxsize=max_pending)
        self._costs = CostModel()
        self._batches, self._tickets = itertools.count(), itertools.count()
        self._threads = [
            threading.Thread(target=self._serve, args=(ev,), name=f"kernelrl-slot-{i}", daemon=True)
            for i, ev in enumerate(slots)
        ]
        for evaluator in self.evaluators:
            evaluator.warm()
        for thread in self._threads:
            thread.start()
        self._closed = False

    @property
    def num_slots(self) -> int:
        return len(self._threads)

    def _serve(self, evaluator: Evaluator) -> None:
        while True:
            *_, item = self._queue.get()
            if item is _STOP:
                return
            try:  # a future cancelled by the caller, or answered by its deadline, is skipped
                if not item.future.set_running_or_notify_cancel():
                    continue
            except RuntimeError:
                continue
            try:
                result = evaluate_retrying_harness_errors(evaluator, item.task, item.solution)
            except BaseException as exc:  # a broken task: the caller sees the TaskError
                settle(item.future, error=exc)
            else:
                self._costs.observe(item.task.hash, result.phase_seconds.get("total", 0.0))
                settle(item.future, result)

    def submit(
        self, tasks: Sequence[Task], solutions: Sequence[str], timeout_s: float | None = None
    ) -> list[Future[EvalResult]]:
        """One future per item, in input order; blocks while ``max_pending`` are queued.
        ``timeout_s``: deadline for this batch."""
        if self._closed:
            raise RuntimeError("pool is closed")
        check_batch(tasks, solutions)
        now = time.monotonic()
        items = [
            _Item(task, solution, Future(), now)
            for task, solution in zip(tasks, solutions, strict=True)
        ]
        if timeout_s is not None and items:
            timer = threading.Timer(timeout_s, self._expire, args=(items, timeout_s))
            timer.daemon = True
            timer.start()
        batch = next(self._batches)
        # Queued longest-first, so that under backpressure the expensive ones still go first.
        for index, cost in self._costs.longest_first(tasks, solutions):
            entry = (batch, -cost, next(self._tickets), items[index])
            self._queue.put(entry)  # blocks when max_pending are queued
        return [item.future for item in items]

    def _expire(self, items: list[_Item], timeout_s: float) -> None:
        where = (self.device, self.device_name, self.versions)
        for item in items:
            if item.future.done():
                continue
            if item.future.running():
                status, why = Status.TIMEOUT, "this evaluation had not finished"
            else:
                status, why = Status.HARNESS_ERROR, "this evaluation had not started"
            why = f"the batch deadline ({timeout_s:.0f} s) passed: {why}"
            verdict = pool_result(
                item.task, item.solution, where, status, why, "batch_timeout",
                submitted=item.submitted,
            )  # fmt: skip
            settle(item.future, verdict)

    def close(self) -> None:
        """Finish what was submitted, then stop the slots and their sandbox children."""
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:  # after every batch: what was submitted is finished first
            self._queue.put((math.inf, 0.0, next(self._tickets), _STOP))
        for thread in self._threads:
            thread.join()
        for evaluator in self.evaluators:
            evaluator.close()
