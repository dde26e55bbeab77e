"""The reference of an untrusted task, run in a sandboxed child instead of the worker.

A task a client sends (``Task.trusted`` false) is code nobody here has read, and its module level
runs as soon as it is loaded: in the worker it would run as the worker's user, with the
worker's environment (its tokens) in reach. So it is never loaded in the worker. Its reference
runs in a child of the evaluator's own ``ChildPool``, as solutions do, through the job curation
validates references with (``session.reference_as_solution``): the child builds the task's
``Model`` from the evaluation's model seed, makes each input set from the seed the solution's
child gets, and streams every output back in full; they become tensors on the worker's device,
which the evaluator compares with the solution's exactly as it compares a trusted reference's.

What comes from the reference's child rather than from the worker:

- the memory plan: the footprint the child measures on the meta device before it allocates
  anything (``await_admission``); its GPU memory is reserved with the solution's, at once;
- ``init_compute``: the ops the child saw its ``Model`` dispatch while it was built, under the
  audit (its ``loaded`` message);
- the reference timing: the child's own report, eager only (no torch.compile baseline), kept
  by no cache. The client writes both sides of an inline task, so its speed-ups are only as
  trustworthy as the client's reference.

Whose failure is what: whatever the reference's child reports or does (an error at any stage,
a crash, a timeout, an unreadable report, outputs over the limit) is the task's, a TaskError:
never a verdict on the solution, never a ``harness_error``. The child runs the task's code, so
even a "harness" failure it reports is the task's word, not evidence. Ours are only what the
worker sees itself: no child could be started, or the child's fork server died
(``ReferenceSandboxLost``, which the evaluator reads as any lost sandbox: a ``harness_error``).
"""

from __future__ import annotations

import contextlib
import math
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

import torch

from kernelrl.env.admission import GpuMemoryBudget, MemoryPlan, memory_plan, plan_for
from kernelrl.env.compare import DTYPES
from kernelrl.env.reference import ReferenceRunner
from kernelrl.env.result import TimingStats
from kernelrl.env.sandbox.child_process import Child, ChildDied
from kernelrl.env.sandbox.processes import ChildPool
from kernelrl.env.sandbox.session import SandboxSession, reference_as_solution
from kernelrl.env.task import Task, TaskError
from kernelrl.env.timing import TimingConfig

Release = Callable[[], None]
Guard = Callable[[], contextlib.AbstractContextManager[Any]]


class JobSettings(Protocol):
    """The evaluator's settings a reference's child runs under (``EvalConfig`` has them)."""

    timeout_s: float
    host_memory_bytes: int
    file_bytes: int
    gpu_memory_fraction: float
    timing: TimingConfig


class ReferenceSandboxLost(ChildDied):
    """Our failure running a reference in the sandbox (no child could be started, its fork
    server died): a ``ChildDied`` that is ours, which the evaluator reports as a harness_error."""

    def __init__(self, description: str) -> None:
        super().__init__(description, ours=True)


class ReferenceStateError(Exception):
    """An untrusted task's reference asked for outside the evaluation that started it: a bug of
    ours, raised past the evaluator's verdicts (never taken for the solution's failure)."""


def _nothing_reserved() -> None:
    """The release of an evaluation admitted without a memory reservation (CPU)."""


class _BothExited:
    """Gives an evaluation's GPU memory back once both of its children have exited: the
    solution's (the evaluator's release, called by its reaper) and the reference's."""

    def __init__(self, release: Release) -> None:
        self._release = release
        self._waiting = {"solution", "reference"}
        self._lock = threading.Lock()

    def _exited(self, which: str) -> None:
        with self._lock:
            if which not in self._waiting:
                return
            self._waiting.discard(which)
            last = not self._waiting
        if last:
            self._release()

    def solution(self) -> None:
        self._exited("solution")

    def reference(self) -> None:
        self._exited("reference")


@dataclass
class SandboxedReference:
    """One evaluation's reference, in its own sandboxed child: started at admission (the child
    loads the task, reports its footprint, builds the Model), asked for outputs call by call,
    timed inside the evaluator's measurement, retired with the evaluation."""

    task: Task
    children: ChildPool
    device: torch.device
    settings: JobSettings

    def __post_init__(self) -> None:
        self.model_seed = secrets.randbits(31)
        self.init_compute: frozenset[str] = frozenset()
        self.max_output_bytes = self.settings.host_memory_bytes
        self._child: Child | None = None
        self._session: SandboxSession | None = None
        self._on_exit: Release = _nothing_reserved

    # ------------------------------------------------------------------ start and end
    def start(self, budget: GpuMemoryBudget | None) -> tuple[MemoryPlan | None, Release]:
        """Start the child and wait until it has built the Model; on a GPU, first reserve the
        memory of both children and the reference's outputs here, from the footprint the child
        reports. Returns the plan and the release the evaluator calls once the solution's child
        has exited (the memory goes back when the reference's has too)."""
        try:
            child = self.children.acquire()
        except RuntimeError as exc:
            raise ReferenceSandboxLost(f"for the task's reference could not start: {exc}") from exc
        self._child = child
        self._session = SandboxSession(
            child, self.settings.timeout_s, self.settings.host_memory_bytes
        )
        context = budget.hold_context() if budget is not None else _nothing_reserved
        admitted: list[Release] = []
        plans: list[MemoryPlan] = []

        def admit(footprint: dict[str, Any]) -> dict[str, int]:
            assert budget is not None and self._session is not None
            plan, reference_bytes = _plan_of(footprint, budget.capacity, self.settings.timing)
            admitted.append(budget.acquire(plan.total_bytes, context=context))
            plans.append(plan)
            # The wait for memory is not the task's time: the child's clock starts now.
            self._session.deadline = time.monotonic() + self.settings.timeout_s
            return {"bytes": reference_bytes, "timing_placements": plan.placements}

        try:
            with self._task_failures("loading"):
                loaded = self._session.start(self._job(), admit if budget is not None else None)
                self._expect(loaded, "loaded", "loading")
                built = loaded.get("init_compute", {})
                if not isinstance(built, dict):
                    raise TypeError("init_compute is not a mapping")
                self.init_compute = frozenset(str(name) for name in built)
        except BaseException:
            self._on_exit = admitted[0] if admitted else context
            self.close()
            raise
        if budget is None:
            return None, _nothing_reserved
        both = _BothExited(admitted[0])
        self._on_exit = both.reference
        self.max_output_bytes = budget.capacity
        return plans[0], both.solution

    def _job(self) -> dict[str, Any]:
        settings, kind = self.settings, self.device.type
        return {
            "device": str(self.device) if kind == "cpu" else "cuda:0",
            "backend": self.task.backend,
            "task_source": self.task.source,
            "size_overrides": self.task.size_overrides(kind),  # declared only: never derived
            **reference_as_solution(),
            "model_seed": self.model_seed,
            "timing": asdict(settings.timing),
            "profile_calls": 0,
            "limits": {
                "file_bytes": settings.file_bytes,
                "cpu_seconds": int(settings.timeout_s * 2) + 30,
                "address_space_bytes": settings.host_memory_bytes,
                "gpu_memory_fraction": settings.gpu_memory_fraction,
            },
        }

    def close(self) -> None:
        """Retire the child; the memory reserved for the evaluation is given back once it and
        the solution's child have exited."""
        child, self._child = self._child, None
        if child is not None:
            self.children.retire(child, then=self._on_exit)
        else:
            self._on_exit()

    # ------------------------------------------------------------------ the evaluation's calls
    def output(self, seed: int, guard: Guard) -> list[Any]:
        """The reference's outputs on input set ``seed``, as tensors on the worker's device
        (plain values as they are), read in full from the child. ``guard`` is held around the
        worker's own GPU work (their allocation, each chunk's copy), never while the child
        computes or the worker waits on it."""
        session = self._live_session()
        with self._task_failures("computing its outputs"):
            session.send_call(seed)
            report = session.receive()
            self._expect(report, "outputs", "computing its outputs")
            described = report["outputs"]
            with guard():
                expected = self._allocate(described)
            flat = {i: v.view(-1) for i, v in enumerate(expected) if type(v) is torch.Tensor}
            filled = dict.fromkeys(flat, 0)

            def fill(index: int, chunk: torch.Tensor) -> None:
                start = filled[index]
                flat[index][start : start + chunk.numel()].copy_(chunk)
                filled[index] = start + chunk.numel()

            session.read_tensors(described, fill, None, guard)
        return expected

    def time(self, compiled: bool) -> TimingStats | None:
        """The child's own timing of the reference (eager; no torch.compile baseline).

        Called inside the evaluator's measurement, where every child but the solution's is
        paused (the solution's is idle by then): this one runs meanwhile, then is paused
        again for the measurement's end to resume it with the others."""
        if compiled:
            return None
        session = self._live_session()
        child = session.child
        paused = child.paused()
        if paused:
            child.resume()
        try:
            with self._task_failures("timing itself"):
                session.send_time(secrets.randbits(31))
                report = session.receive()
                self._expect(report, "timing", "timing itself")
                return TimingStats.from_report(
                    report["runtime"], self.settings.timing.most_placements
                )
        finally:
            if paused:
                child.pause()

    # ------------------------------------------------------------------ the child's reports
    def _live_session(self) -> SandboxSession:
        """The child's session, its clock started anew: between two requests the child waits
        on the solution's, which is not the task's time; each request has the whole limit."""
        if self._session is None or self._child is None:
            raise ReferenceStateError(f"task {self.task.id}: its reference's child is not running")
        self._session.deadline = time.monotonic() + self.settings.timeout_s
        return self._session

    def _allocate(self, described: Any) -> list[Any]:
        """Empty tensors for the outputs the child describes (or their plain values), after
        checking the description: known dtypes, sizes that add up, under the limit."""
        if type(described) is not list:
            raise TypeError("the outputs are not described as a list")
        shapes: list[tuple[torch.dtype, tuple[int, ...]] | None] = []
        total = 0
        for entry in described:
            kind = entry.get("kind") if type(entry) is dict else None
            if kind == "value" and type(entry.get("value")) in (bool, int, float, type(None)):
                shapes.append(None)
                continue
            if kind != "tensor":
                raise TaskError(
                    f"task {self.task.id}: its reference returned something other than tensors "
                    f"and numbers ({entry!r:.200})"
                )
            dtype = DTYPES.get(str(entry.get("dtype")))
            shape = tuple(int(d) for d in entry.get("shape", ()))
            if dtype is None or min(shape, default=0) < 0:
                raise ValueError(f"malformed output description {entry!r:.200}")
            nbytes = math.prod(shape) * dtype.itemsize
            if int(entry.get("nbytes", -1)) != nbytes:
                raise ValueError(f"malformed output description {entry!r:.200}")
            total += nbytes
            shapes.append((dtype, shape))
        if total > self.max_output_bytes:
            raise TaskError(
                f"task {self.task.id}: its reference's outputs take {total} bytes, over the "
                f"{self.max_output_bytes} this evaluator holds for them"
            )
        try:
            return [
                torch.empty(spec[1], dtype=spec[0], device=self.device)
                if spec is not None
                else entry["value"]
                for spec, entry in zip(shapes, described, strict=True)
            ]
        except torch.OutOfMemoryError:
            raise  # the GPU's memory on the trusted side: ours, as for a trusted reference
        except RuntimeError as exc:  # host memory, as a trusted reference's would be the task's
            raise TaskError(
                f"task {self.task.id}: its reference's outputs ({total} bytes) do not fit in "
                f"the worker's memory: {exc}"[:600]
            ) from exc

    def _expect(self, message: dict[str, Any], wanted: str, doing: str) -> None:
        kind = message.get("type")
        if kind == wanted:
            return
        if kind == "error":
            stage, error = message.get("stage"), str(message.get("error", ""))[-1500:]
            raise TaskError(
                f"task {self.task.id}: its reference failed in the sandbox while {doing} "
                f"({stage}): {error}{self._size_hint()}"
            )
        if kind == "not_run":
            raise TaskError(
                f"task {self.task.id}: its reference cannot run on this device: "
                f"{str(message.get('reason', ''))[:500]}"
            )
        raise ValueError(f"expected {wanted!r}, got {kind!r}")

    def _size_hint(self) -> str:
        if self.device.type != "cpu" or "cpu" in self.task.sizes:
            return ""
        return (
            " (an untrusted task runs on CPU at its published sizes, never derived ones: "
            'declare smaller ones with KERNELRL = {"sizes": {"cpu": {...}}})'
        )

    @contextlib.contextmanager
    def _task_failures(self, doing: str) -> Iterator[None]:
        """What goes wrong with the reference's child, said as the task's failure (TaskError),
        except what the worker can show is its own (``ReferenceSandboxLost``)."""
        where = f"task {self.task.id}: its reference, run in the sandbox while {doing},"
        try:
            yield
        except (TaskError, ReferenceSandboxLost, ReferenceStateError):
            raise
        except ChildDied as exc:
            raise self._died(exc, where) from exc
        except (OSError, EOFError) as exc:  # the channel broke: the child is gone or hung up
            child = self._child
            if child is not None and child.process.poll() is not None:
                raise self._died(child.died(), where) from exc
            raise TaskError(f"{where} closed its channel ({type(exc).__name__})") from exc
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise TaskError(
                f"{where} sent an unreadable report ({type(exc).__name__}: {exc})"[:800]
            ) from exc

    def _died(self, exc: ChildDied, where: str) -> Exception:
        if exc.ours:
            return ReferenceSandboxLost(f"running the task's reference {exc}")
        tail = self._child.output_tail(400).strip() if self._child is not None else ""
        last = f"; last output: {tail}" if tail else ""
        return TaskError(f"{where} {exc}{self._size_hint()}{last}")


def _plan_of(
    footprint: dict[str, Any], capacity: int, timing: TimingConfig
) -> tuple[MemoryPlan, int]:
    """The evaluation's plan from the footprint the reference's child reported, timed as
    ``timing`` says, and the bytes admitted to that child. ``child_bytes`` is the
    solution's child's share; ``trusted_bytes`` the reference's child's plus its outputs on the
    worker. A footprint the child could not measure reserves the whole device (the evaluation
    runs alone), timed on one placement."""
    if "error" in footprint:
        share = capacity // 3
        return MemoryPlan(share, capacity - share, True, 1), share
    numbers = [int(footprint[k]) for k in ("input_bytes", "param_bytes", "output_bytes")]
    if min(numbers) < 0:
        raise ValueError(f"negative footprint {numbers}")
    one = plan_for(*numbers, timing)
    trusted = one.child_bytes + numbers[2] * one.outputs_ahead
    return replace(one, trusted_bytes=trusted), one.child_bytes


# ---------------------------------------------------------------------------- the router
@dataclass
class _Evaluation:
    owner: TaskReferences
    reference: SandboxedReference | None = None


_EVALUATION: ContextVar[_Evaluation | None] = ContextVar("kernelrl_evaluation", default=None)


class TaskReferences:
    """An evaluator's references: a trusted task's in this process (``ReferenceRunner``), an
    untrusted task's in a sandboxed child of the evaluator's pool, one per evaluation. The same
    calls serve both, so the evaluator's procedure is one, whichever runs the reference.

    An untrusted task's reference belongs to the evaluation that started it: the calls of that
    evaluation (one thread, inside ``evaluating``) find it; its child is retired when the
    evaluation ends."""

    def __init__(self, runner: ReferenceRunner, children: ChildPool, settings: JobSettings):
        self.runner = runner
        self.device = runner.device
        self.children = children
        self.settings = settings

    @contextlib.contextmanager
    def evaluating(self) -> Iterator[None]:
        """The scope of one evaluation on this thread."""
        evaluation = _Evaluation(self)
        token = _EVALUATION.set(evaluation)
        try:
            yield
        finally:
            _EVALUATION.reset(token)
            if evaluation.reference is not None:
                evaluation.reference.close()

    def admit(
        self, task: Task, budget: GpuMemoryBudget | None
    ) -> tuple[MemoryPlan | None, Release]:
        """The evaluation's memory plan (None without a GPU budget) once its memory is
        reserved, and the release the evaluator calls when the solution's child has exited.
        An untrusted task's reference child starts here: it loads the task (a TaskError when it
        cannot) and reports the footprint that the plan is made of."""
        if task.trusted:
            plan = memory_plan(task, self.settings.timing) if budget is not None else None
            return plan, (
                budget.acquire(plan.total_bytes) if budget and plan else _nothing_reserved
            )
        evaluation = _EVALUATION.get()
        if evaluation is None or evaluation.owner is not self or evaluation.reference is not None:
            raise ReferenceStateError(f"task {task.id}: admitted outside its own evaluation")
        evaluation.reference = SandboxedReference(task, self.children, self.device, self.settings)
        return evaluation.reference.start(budget)

    def _sandboxed(self, task: Task) -> SandboxedReference:
        evaluation = _EVALUATION.get()
        reference = evaluation.reference if evaluation and evaluation.owner is self else None
        if reference is None or reference.task.hash != task.hash:
            raise ReferenceStateError(f"task {task.id}: no reference was started for it here")
        return reference

    def model_seed(self, task: Task) -> int:
        """The seed the evaluation builds both models from: drawn here for a trusted task, the
        one the reference's child was started with for an untrusted one."""
        return secrets.randbits(31) if task.trusted else self._sandboxed(task).model_seed

    def init_compute(self, task: Task) -> frozenset[str]:
        if task.trusted:
            return self.runner.init_compute(task)
        return self._sandboxed(task).init_compute

    def model_and_outputs(
        self, task: Task, model_seed: int, seeds: list[int], guard: Guard
    ) -> tuple[Any, list[list[Any]]]:
        """The reference model (for an untrusted task the handle of its child's) and its
        outputs on ``seeds``, the worker's own GPU work under ``guard``: a trusted task's model
        and outputs in one turn of it; an untrusted task's child is never waited on under it."""
        if task.trusted:
            with guard():
                model = self.runner.model(task, model_seed)
                return model, [self.runner.output(task, model, seed) for seed in seeds]
        reference = self._sandboxed(task)
        if model_seed != reference.model_seed:
            raise ReferenceStateError(f"task {task.id}: its reference was built from another seed")
        return reference, self.outputs(task, reference, seeds, guard)

    def outputs(self, task: Task, model: Any, seeds: list[int], guard: Guard) -> list[list[Any]]:
        """The outputs of ``model`` (``model_and_outputs``'s) on ``seeds``, as that says."""
        if task.trusted:
            with guard():
                return [self.runner.output(task, model, seed) for seed in seeds]
        if model is not self._sandboxed(task):
            raise ReferenceStateError(f"task {task.id}: outputs asked of another reference")
        return [model.output(seed, guard) for seed in seeds]

    def time(self, task: Task, compiled: bool, config: TimingConfig) -> TimingStats | None:
        """A trusted task's reference timed here; an untrusted one's timed by its child, with
        the timing settings it was started with (the evaluator's, placements as admitted)."""
        if task.trusted:
            return self.runner.time(task, compiled, config)
        return self._sandboxed(task).time(compiled)
