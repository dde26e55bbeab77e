"""How a failure inside the sandboxed child is reported: the solution's own (compile or runtime
error, with its traceback) or one of the harness's steps (loading the task, making its inputs).

The child only reports; the worker decides whose failure it is (``kernelrl.env.attribution``):
a step of the harness that fails once solution code has run in the child is no evidence of a
failure of ours, since the solution shares the child's interpreter, memory and tensors."""

from __future__ import annotations

import socket
import traceback

import torch

from kernelrl.env.sandbox.compile_only import CompiledOnly, GpuOnly
from kernelrl.env.sandbox.protocol import send_message


class HarnessFailure(RuntimeError):
    """A step of the harness failed in the sandbox. ``stage`` says where: ``task`` (loading
    the task), ``inputs`` (its get_inputs) or ``harness``; the worker decides what each means
    for it (the evaluator: ours only while no solution code has run; curation, validating the
    task: the task's)."""

    def __init__(self, message: str, stage: str = "harness") -> None:
        super().__init__(message)
        self.stage = stage


class SolutionFailure(RuntimeError):
    """The solution's own code raised; ``stage`` is ``compile`` or ``runtime``."""

    def __init__(self, stage: str, cause: BaseException) -> None:
        super().__init__(exception_text(cause))
        self.stage = stage
        self.cause = cause


def exception_text(exc: BaseException) -> str:
    """``Name: message`` of an exception the solution may have defined, read so that its own
    code (a ``__str__`` that raises, exits or lies about its class) cannot turn the solution's
    failure into ours."""
    name = type.__dict__["__name__"].__get__(type(exc))
    try:
        message = str(exc)
    except BaseException:  # noqa: BLE001 - the solution's message, not our failure
        message = "<the exception's message could not be read>"
    return f"{name}: {message}"


def short_traceback(exc: BaseException, limit_chars: int = 2000) -> str:
    """The traceback frames of the solution only, with its own line numbers."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if f.filename.startswith("<kernelrl_solution")]
    lines = [f"  line {f.lineno}, in {f.name}: {f.line or ''}".rstrip() for f in own[-4:]]
    message = exception_text(exc)
    text = "\n".join([*lines, message]) if lines else message
    return text[-limit_chars:]


def is_compile_error(exc: BaseException) -> bool:
    """Errors Triton's compiler raises; under the interpreter, errors raised inside kernel code
    (shape, type and API misuse: what the compiler would have rejected; true memory faults
    crash the process instead)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(
        names
        & {
            "CompilationError",
            "CompileTimeAssertionFailure",
            "MLIRCompilationError",
            "InterpreterError",
        }
    )


def compile_error_stage(exc: BaseException) -> str:
    return "compile" if is_compile_error(exc) else "runtime"


class NotRunHere(RuntimeError):
    """The solution uses what only a GPU can run (inline PTX under Triton's CPU interpreter):
    neither its fault nor ours, so it is reported ``not_run``, as CUDA C++ is on a CPU."""


def interpreter_cannot_run(exc: BaseException) -> str | None:
    """Why Triton's CPU interpreter could not run a kernel, when Triton says so itself: a
    ``NotImplementedError`` raised in Triton's own code (not the solution's), a libdevice
    function (``compile_only.refuse_libdevice_in_interpreter``), or Triton asking for a GPU
    driver (the autotuner benchmarks its configs on one)."""
    if type(exc).__name__ == "InterpreterError" and type(exc.__cause__) is GpuOnly:
        return f"Triton's CPU interpreter cannot run this kernel ({exc.__cause__}); it needs a GPU"
    if type(exc).__name__ == "InterpreterError" and type(exc.__cause__) is NotImplementedError:
        cause = exc.__cause__
        if _raised_in_triton(cause, "/triton/"):
            return f"Triton's CPU interpreter cannot run this kernel ({cause}); it needs a GPU"
    if type(exc) is RuntimeError and _raised_in_triton(exc, "/triton/runtime/driver.py"):
        return f"Triton needs a GPU driver here ({exc}): autotuning benchmarks on a GPU"
    return None


def _raised_in_triton(exc: BaseException, path: str) -> bool:
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and path in frames[-1].filename


def solution_failure(exc: BaseException) -> Exception:
    """What the solution's own code raised, said as the solution's fault; ``not_run`` where it
    needs what only a GPU can run. A GPU out of memory is reported as the solution's too, with
    ``out_of_memory`` set: only the worker, which sees the device and this process's share of
    it from outside (``sandbox.gpu_memory``), can tell whether other work took that share."""
    unsupported = gpu_only_reason(exc)
    if unsupported:
        return NotRunHere(unsupported)
    return SolutionFailure(compile_error_stage(exc), exc)


def gpu_only_reason(exc: BaseException) -> str | None:
    """Why ``exc`` says the code needs a GPU (Triton's interpreter, CUDA C++ compiled only)."""
    if type(exc) is CompiledOnly:
        return str(exc)
    return interpreter_cannot_run(exc)


def out_of_memory(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an exception it was raised from, is a GPU out of memory: a claim
    the worker weighs against what it sees itself. Read off the type and the base class's own
    slots, so that nothing the solution defined runs."""
    cause = BaseException.__dict__["__cause__"]
    context = BaseException.__dict__["__context__"]
    for _ in range(8):
        if exc is None:
            return False
        if issubclass(type(exc), torch.OutOfMemoryError):
            return True
        exc = cause.__get__(exc) or context.__get__(exc)
    return False


def report_failure(sock: socket.socket, exc: BaseException, phase: dict[str, float]) -> None:
    if type(exc) is NotRunHere:
        message = {"type": "not_run", "reason": str(exc)}
    elif isinstance(exc, SolutionFailure):
        message = {
            "type": "error",
            "stage": exc.stage,
            "error": short_traceback(exc.cause),
            "out_of_memory": out_of_memory(exc.cause),
        }
    else:  # a step of the harness failed: the worker decides whose failure that is
        where = traceback.extract_tb(exc.__traceback__)[-1:] or []
        at = f" (at {where[0].name}:{where[0].lineno})" if where else ""
        stage = exc.stage if isinstance(exc, HarnessFailure) else "harness"
        message = {
            "type": "error",
            "stage": stage,
            "error": f"{exc!r}{at}"[-2000:],
            "out_of_memory": out_of_memory(exc),
        }
    send_message(sock, {**message, "phase": phase})
