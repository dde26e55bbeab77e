"""Whose failure it is when an evaluation's sandbox child stops early: the solution's or ours.

``harness_error`` is unscored and retried, never penalised, so a policy that can cause one
learns to. It is given only where the trusted side can show the failure is ours:

- Before the solution is sent (``SandboxSession.solution_sent``), only our code and the task's
  have run in the child: a failure there is ours (a trusted task loaded and made its inputs in
  the worker; the child made them once more before it was sent the solution), or an untrusted
  task's (a ``TaskError``, raised by the evaluator).
- After, the child's word is no evidence of anything, its claims of a failure of ours included:
  the solution shares its interpreter, its memory and the harness's tensors. A failure is the
  solution's, except a GPU out-of-memory when the worker sees for itself that the device, not
  the solution, was short of the evaluation's share (``sandbox.gpu_memory.GpuShare``).
- A child that dies, hangs, or sends what cannot be read after the solution was sent is the
  solution's too, unless the worker's own side failed (the child's fork server died).
- ``not_run`` (what only a GPU can run) is believed on a CPU only: a GPU runs everything.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kernelrl.env.result import EvalResult, Status

# The stages of the harness's own steps in the child (``sandbox.failures.HarnessFailure``).
HARNESS_STAGES = ("harness", "task", "inputs")


class TrustedWorkFailed(Exception):
    """The worker's own computation raised (a reference output, a comparison): ours."""


@contextlib.contextmanager
def trusted_work(passing: tuple[type[BaseException], ...]) -> Iterator[None]:
    """Work only the trusted side does, on what it validated: an exception in it is a fault of
    ours and comes out as ``TrustedWorkFailed``, which the evaluator makes a ``harness_error``,
    so that its catch-all for a report it cannot read never turns our failure into the
    solution's ``runtime_error``. ``passing``: exceptions that already say whose they are (a
    task's, out of memory, a child's death)."""
    try:
        yield
    except passing:
        raise
    except Exception as exc:
        raise TrustedWorkFailed(f"{type(exc).__name__}: {exc}") from exc


@dataclass(frozen=True)
class Blame:
    """A verdict on an early stop: ``ours`` makes it a ``harness_error`` whatever ``status``."""

    status: Status
    error: str
    ours: bool = False

    def apply(self, result: EvalResult) -> None:
        if self.ours:
            harness_error(result, self.error)
        else:
            result.status, result.error = self.status, self.error


def harness_error(result: EvalResult, why: str) -> None:
    """Our failure, said as ours: the solution is neither blamed nor rewarded for it."""
    result.status = Status.HARNESS_ERROR
    result.error = f"kernelrl harness error (not the solution's fault): {why}"


def child_error(
    message: dict[str, Any], solution_sent: bool, shortfall: Callable[[], str | None]
) -> Blame:
    """An ``error`` message of the child. ``shortfall`` asks the worker's own view of the GPU
    (``SandboxSession.memory_shortfall``), only for a claimed out-of-memory."""
    stage = str(message.get("stage", ""))
    error = str(message.get("error", ""))
    if not solution_sent:
        return Blame(
            Status.HARNESS_ERROR,
            f"the harness failed inside the sandbox before the solution was loaded ({stage}): "
            f"{error}",
            ours=True,
        )
    if message.get("out_of_memory") is True:
        why = shortfall()
        if why:
            return Blame(
                Status.HARNESS_ERROR,
                f"the sandbox ran out of GPU memory and {why} ({(error.splitlines() or [''])[-1]})",
                ours=True,
            )
    if stage == "compile":
        return Blame(Status.COMPILE_ERROR, error)
    if stage in HARNESS_STAGES:
        return Blame(
            Status.RUNTIME_ERROR,
            f"a step of the harness ({stage}) failed in the sandbox after the solution's code "
            "had run there, in the same process; the worker made this task and its inputs "
            f"itself, so the failure is the solution's: {error}",
        )
    return Blame(Status.RUNTIME_ERROR, error)


def not_run(message: dict[str, Any], device_kind: str) -> Blame:
    """A ``not_run`` message: believed on a CPU, where the trusted side knows the interpreter
    and a missing GPU cannot run everything; on a GPU, a claim that explains nothing."""
    reason = str(message.get("reason", ""))
    if device_kind != "cpu":
        return Blame(
            Status.RUNTIME_ERROR,
            f"the sandbox said the solution cannot run on this GPU, which runs every kernel: "
            f"{reason}",
        )
    return Blame(Status.NOT_RUN, reason)


def child_lost(description: str, ours: bool, solution_sent: bool, timed_out: bool) -> Blame:
    """A child that died, hung or was killed (``ChildDied``): ours when its fork server died or
    before the solution was sent (an untrusted task's failure is raised by the evaluator)."""
    if ours:
        return Blame(Status.HARNESS_ERROR, f"the sandbox child {description}", ours=True)
    if not solution_sent:
        return Blame(
            Status.HARNESS_ERROR,
            f"the sandbox child {description}, before the solution was loaded",
            ours=True,
        )
    status = Status.TIMEOUT if timed_out else Status.RUNTIME_ERROR
    return Blame(status, f"the solution's process {description}")
