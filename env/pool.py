"""LocalPool: the embedded evaluation pool (this machine's GPUs, or CPU slots).

Interface shared with the Ray pool: ``submit(tasks, solutions) -> futures``,
``evaluate(tasks, solutions) -> results``, ``await aevaluate(...)``. Submission blocks when
``max_pending`` evaluations are queued (backpressure for trainers that produce faster than the
GPUs evaluate). Every evaluation runs its solution in a fresh sandboxed child, so a crashing or
hanging solution costs one child, never a slot.

A ``harness_error`` (kernelrl's own failure: serialisation, a limit we set, a CUDA context, our
bug) says nothing about the solution and is often transient, so it is evaluated once more, from
scratch in a fresh child; a second ``harness_error`` is returned, marked as retried
(``retried_harness_error``). RayPool does the same.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
from collections.abc import Sequence
from concurrent.futures import Future

import torch

from kernelrl.env.evaluator import EvalConfig, Evaluator
from kernelrl.env.pools import EVALS_PER_GPU
from kernelrl.env.result import EvalResult, Status
from kernelrl.env.task import Task

log = logging.getLogger(__name__)

_STOP = object()
# EvalResult.sandbox keys of a result whose first evaluation was a harness_error.
HARNESS_RETRIES_KEY = "harness_retries"
HARNESS_FIRST_ERROR_KEY = "harness_first_error"


def is_harness_error(result: EvalResult) -> bool:
    return Status(result.status) is Status.HARNESS_ERROR


def retried_harness_error(first: EvalResult, second: EvalResult) -> EvalResult:
    """``second``, the result of evaluating again after ``first`` was a harness_error, marked so
    that reports and operators see the retry: ``sandbox["harness_retries"] = 1`` and the first
    error in ``sandbox["harness_first_error"]``; a second harness_error also says so in its
    ``error``. Whatever the second verdict is, it is the one returned."""
    second.sandbox[HARNESS_RETRIES_KEY] = 1
    second.sandbox[HARNESS_FIRST_ERROR_KEY] = first.error[-2000:]
    if is_harness_error(second):
        second.error = (
            f"{second.error}\n[kernelrl evaluated this solution twice, each time in a fresh"
            " sandbox, and its harness failed both times; first failure:"
            f" {_first_line(first.error)}]"
        ).lstrip()
    return second


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0] if lines else "(no message)"


def evaluate_retrying_harness_errors(evaluator: Evaluator, task: Task, solution: str) -> EvalResult:
    """One evaluation, repeated once (a fresh child) when the harness failed."""
    result = evaluator.evaluate(task, solution)
    if not is_harness_error(result):
        return result
    log.warning("harness_error on %s, evaluating once more: %s", task.id, _first_line(result.error))
    return retried_harness_error(result, evaluator.evaluate(task, solution))


class LocalPool:
    def __init__(
        self,
        config: EvalConfig | None = None,
        workers: int | None = None,
        per_gpu: int = EVALS_PER_GPU,
        max_pending: int = 1024,
    ) -> None:
        """``workers``: CPU slots, or GPUs to use; ``per_gpu``: evaluations in flight per GPU
        (one compiles and checks while another is timed; timing itself is exclusive)."""
        self.config = config or EvalConfig()
        kind = self.config.resolved_device()
        if kind == "cuda":
            gpus = (
                torch.cuda.device_count()
                if workers is None
                else min(workers, torch.cuda.device_count())
            )
            # A child needs ~4 s to import torch and make its context, an evaluation ~2 s:
            # keep two spares per slot warming so that no slot waits for one.
            self.config.spare_children = max(self.config.spare_children, 2 * per_gpu)
            self.evaluators = [Evaluator(self.config, gpu_index=i) for i in range(gpus)]
            slots = [ev for ev in self.evaluators for _ in range(per_gpu)]
        else:
            count = workers or max(os.cpu_count() or 1, 1)
            self.config.spare_children = max(self.config.spare_children, count)
            self.evaluators = [Evaluator(self.config)]
            slots = [self.evaluators[0]] * count
        self._queue: queue.Queue = queue.Queue(maxsize=max_pending)
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
            item = self._queue.get()
            if item is _STOP:
                return
            task, solution, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(evaluate_retrying_harness_errors(evaluator, task, solution))
            except BaseException as exc:  # a broken task: the caller sees the TaskError
                future.set_exception(exc)

    def submit(self, tasks: Sequence[Task], solutions: Sequence[str]) -> list[Future[EvalResult]]:
        if self._closed:
            raise RuntimeError("pool is closed")
        if len(tasks) != len(solutions):
            raise ValueError(f"{len(tasks)} tasks but {len(solutions)} solutions")
        futures: list[Future[EvalResult]] = []
        for task, solution in zip(tasks, solutions, strict=True):
            future: Future[EvalResult] = Future()
            self._queue.put((task, solution, future))  # blocks when max_pending are queued
            futures.append(future)
        return futures

    def evaluate(self, tasks: Sequence[Task], solutions: Sequence[str]) -> list[EvalResult]:
        return [future.result() for future in self.submit(tasks, solutions)]

    async def aevaluate(self, tasks: Sequence[Task], solutions: Sequence[str]) -> list[EvalResult]:
        futures = await asyncio.to_thread(self.submit, tasks, solutions)
        return list(await asyncio.gather(*(asyncio.wrap_future(f) for f in futures)))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._queue.put(_STOP)
        for thread in self._threads:
            thread.join()
        for evaluator in self.evaluators:
            evaluator.close()

    def __enter__(self) -> LocalPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
