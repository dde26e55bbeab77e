"""Verdicts a pool gives or amends itself, built with the evaluator's own constructors.

- A ``harness_error`` (kernelrl's harness failed, not the solution) says nothing about the
  solution and is often transient: every pool evaluates it once more, from scratch, and returns
  the second verdict marked as retried.
- When the pool cannot get an evaluation done - its worker was lost for good, a batch deadline
  passed, the pool was closed - it answers itself, marked ``sandbox["pool_error"]`` so that a
  results cache never serves the answer again. What never ran is a ``harness_error`` (not the
  kernel's fault); a solution that kept killing or hanging its worker is blamed for it.
"""

from __future__ import annotations

import time

from kernelrl.env.evaluator import finish_result, harness_error, new_result
from kernelrl.env.result import POOL_ERROR_KEY, EvalResult, Status
from kernelrl.env.task import Task

# EvalResult.sandbox keys of a result whose first evaluation was a harness_error.
HARNESS_RETRIES_KEY = "harness_retries"
HARNESS_FIRST_ERROR_KEY = "harness_first_error"


def is_harness_error(result: EvalResult) -> bool:
    return not result.scored


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
            f" {first_line(first.error)}]"
        ).lstrip()
    return second


def pool_result(
    task: Task,
    solution: str,
    where: tuple[str, str, dict[str, str]],
    status: Status,
    why: str,
    reason: str,
    *,
    attempts: int = 0,
    submitted: float | None = None,
) -> EvalResult:
    """The pool's own verdict on one item. ``where``: (device, device_name, versions) of the
    pool's workers; ``reason``: the ``pool_error`` tag (``closed``, ``no_workers``,
    ``batch_timeout``, ``worker_failed``); ``submitted``: monotonic time it was submitted."""
    result = new_result(task, solution, *where)
    if status is Status.HARNESS_ERROR:
        harness_error(result, why)
    else:
        result.status, result.error = status, why
    result.sandbox = {POOL_ERROR_KEY: reason, "attempts": attempts}
    seconds = time.monotonic() - submitted if submitted is not None else 0.0
    return finish_result(result, seconds)


def first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0] if lines else "(no message)"
