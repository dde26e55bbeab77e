"""One evaluation, end to end, on the trusted side.

parse -> static checks -> sandboxed child (load/compile, correctness calls) while the worker
computes references -> comparison and dynamic checks -> timing and CUPTI profile (GPU, one
solution at a time per GPU) -> reference timings (cached) -> EvalResult with feedback.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from kernelrl.env.admission import GpuMemoryBudget, MemoryPlan
from kernelrl.env.attribution import TrustedWorkFailed, child_lost, harness_error, trusted_work
from kernelrl.env.backends import solution_kernel_names
from kernelrl.env.compare import Comparison, OutputMatcher
from kernelrl.env.feedback import build_feedback
from kernelrl.env.gpu_claim import GpuClaim, Sharing
from kernelrl.env.gpu_lock import GpuLock
from kernelrl.env.gpu_quiet import QuietProbe
from kernelrl.env.information import reference_rerun
from kernelrl.env.integrity.static_checks import NOT_HACKS, run_static_checks
from kernelrl.env.measure import ChildRunPhases
from kernelrl.env.parse import FormatError, extract_solution
from kernelrl.env.reference import (
    PlacementTimer,
    ReferenceRunner,
    ReferenceTimingCache,
    device_name,
    library_versions,
)
from kernelrl.env.result import EvalResult, Status, TimingStats
from kernelrl.env.sandbox.child_process import ChildDied
from kernelrl.env.sandbox.gpu_memory import GpuShare, counted_until_exit, watch_for
from kernelrl.env.sandbox.processes import ChildPool
from kernelrl.env.sandbox.session import SandboxSession
from kernelrl.env.sandboxed_reference import ReferenceStateError, TaskReferences
from kernelrl.env.single_flight import SingleFlight
from kernelrl.env.task import Task, TaskError
from kernelrl.env.timing import TimingConfig


@dataclass
class EvalConfig:
    """How one evaluation is run. Defaults suit the bundled suite on an H100 and on CPU."""

    device: str = "auto"  # "cpu", "cuda", or "auto" (cuda when available)
    timeout_s: float = 180.0  # wall clock for one evaluation inside the sandbox
    num_input_sets: int = 3
    profile_calls: int = 5
    time_reference_compile: bool = True  # torch.compile baseline (GPU only)
    # A trusted task's reference timing is measured once and reused (the cache); off, every
    # evaluation times its reference in its own exclusive window, interleaved with the
    # solution's input sets (``env/side_by_side.py``): each speed-up measured side by side, at
    # the cost of a reference timing per evaluation.
    cache_reference_timing: bool = True
    host_memory_bytes: int = 16 * 2**30
    gpu_memory_fraction: float = 0.9
    # Which waiting evaluation GPU memory goes to (``GpuMemoryBudget.in_order``, ``backfill``).
    admission_in_order: bool = True
    admission_backfill: bool = False
    file_bytes: int = 4 * 2**30
    spare_children: int = 1
    # Before a solution or a reference is timed, with the other sandboxes paused, the GPU must
    # be found running nothing of theirs (``gpu_quiet``) within this long; else the timing is
    # unused (the kernels a paused sandbox queued before its pause still run).
    gpu_quiet_timeout_s: float = 2.0
    # Let sandboxes still importing torch run during a measurement (sandbox.processes.ChildPool).
    run_importing_during_measurement: bool = False
    # A GPU child's Triton kernels compiled by a companion sandbox without a GPU, which other
    # evaluations' measurements never pause (``sandbox.compiler``).
    compile_ahead: bool = False
    # Off only to test that the sandbox and the dynamic checks hold on their own.
    static_checks: bool = True
    timing: TimingConfig = field(default_factory=TimingConfig)

    def resolved_device(self) -> str:
        return resolve_device(self.device)


# What an evaluation records of its child's ready message (from our code alone, before any
# solution ran there): how it is isolated, and what its start cost ahead of time.
SANDBOX_RECORD = (
    "network",
    "isolation",
    "import_seconds",
    "cuda_init_seconds",
    "profiler_init_seconds",
    "audit_init_seconds",
    "ring_lock_seconds",
    "output_ring",
    "ring_map_seconds",
    "device_ring_refused",
    "gate_seconds",
    "import_cpu_seconds",
    "cpu_seconds",
)
# What the trusted side's work may raise that already says whose failure it is.
_SAYS_WHOSE = (TaskError, torch.OutOfMemoryError, ChildDied, ReferenceStateError)


def resolve_device(device: str) -> str:
    """``cpu`` or ``cuda`` for a requested ``cpu`` / ``cuda`` / ``auto``; a clear error for a
    CUDA request without a visible GPU."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu, cuda or auto, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but no CUDA GPU is visible")
    return device


class Evaluator(ChildRunPhases):
    """Evaluates solutions on one device. Thread-safe: several evaluations may be in flight.

    On a GPU a measurement (timing and profile of a solution, timing of a reference) has the
    device to itself: it takes the lock that this process's own GPU work takes (references,
    comparisons) and pauses the other sandboxes running on the device until it is done.
    Compilation and correctness runs of other evaluations overlap everything else.
    """

    def __init__(
        self,
        config: EvalConfig | None = None,
        gpu_index: int = 0,
        timing_cache: ReferenceTimingCache | None = None,
    ) -> None:
        self.config = config or EvalConfig()
        self.device_kind = self.config.resolved_device()
        self.device = (
            torch.device("cuda", gpu_index) if self.device_kind == "cuda" else torch.device("cpu")
        )
        # Calibrated before any sandbox exists, so its fastest probe is an unobstructed one.
        self.quiet = QuietProbe(self.device) if self.device_kind == "cuda" else None
        self.children = ChildPool(
            self.device_kind,
            gpu_index if self.device_kind == "cuda" else None,
            self.config.spare_children,
            pause_importing=not self.config.run_importing_during_measurement,
        )
        # A trusted task's reference runs here, an untrusted one's in a child of this pool.
        self.references = TaskReferences(ReferenceRunner(self.device), self.children, self.config)
        self.gpu_memory = (
            GpuMemoryBudget.for_device(
                self.device,
                warming=self.config.spare_children,
                in_order=self.config.admission_in_order,
                backfill=self.config.admission_backfill,
            )
            if self.device_kind == "cuda"
            else None
        )
        # Other evaluators on this GPU time each other's kernels (gpu_claim.py).
        self.gpu_claim = GpuClaim.for_device(self.device) if self.device_kind == "cuda" else None
        self.timing_cache = timing_cache or ReferenceTimingCache()
        # On a GPU a reference's preparation holds the lock of every trusted GPU step and its
        # timing an exclusive window: made once per task (single_flight.py). On a CPU neither
        # is shared, and a twin waiting for the other would only be slower.
        self.reference_timings_in_flight = SingleFlight() if self.device_kind == "cuda" else None
        self.gpu_lock = GpuLock()
        self.versions = library_versions()
        self.device_name = device_name(self.device)

    def warm(self) -> None:
        self.children.warm()
        if self.device_kind == "cuda":
            # A task's memory plan runs it on the meta device, whose decompositions import
            # torch._dynamo (2 s) on the first call: paid here, at the pool's start, rather than
            # by the first evaluations' admission, all waiting on that one import.
            import torch._dynamo  # noqa: F401

    def close(self) -> None:
        self.children.close()
        if self.gpu_claim is not None:
            self.gpu_claim.close()

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ pipeline
    def evaluate(self, task: Task, completion: str) -> EvalResult:
        started = time.perf_counter()
        result = new_result(task, completion, self.device_kind, self.device_name, self.versions)
        self.gpu_lock.take_trusted_seconds()  # this thread's count starts with this evaluation
        try:
            with self.references.evaluating():
                self._run(task, completion, result)
        finally:
            if self.device_kind == "cuda":
                wait, held = self.gpu_lock.take_trusted_seconds()
                result.phase_seconds["trusted_gpu_wait"] = wait
                result.phase_seconds["trusted_gpu_held"] = held
            finish_result(result, time.perf_counter() - started)
        return result

    def _run(self, task: Task, completion: str, result: EvalResult) -> None:
        source = check_statically(task, completion, result, self.config.static_checks)
        if source is None:
            return
        own_names = solution_kernel_names(source, task.backend)

        waited = time.perf_counter()
        try:  # an untrusted task's reference child starts here and reports the footprint
            plan, release = self.references.admit(task, self.gpu_memory)
        except ChildDied as exc:  # only ever ours: the reference's failures are TaskErrors
            harness_error(result, f"the sandbox child {exc}")
            return
        result.phase_seconds["admission"] = time.perf_counter() - waited
        with self.gpu_claim.held() if self.gpu_claim else contextlib.nullcontext():
            self._run_admitted(task, source, own_names, result, plan, release)

    def _run_admitted(
        self,
        task: Task,
        source: str,
        own_names: list[str],
        result: EvalResult,
        plan: MemoryPlan | None,
        release: Callable[[], None],
    ) -> None:
        """``release`` gives back the admitted GPU memory: once the child has exited, which
        its reaper sees after this returns (the verdict does not wait for the teardown)."""
        wait_started = time.perf_counter()
        try:
            child = self.children.acquire()
        except RuntimeError as exc:
            release()
            harness_error(result, f"no sandbox could be started: {exc}")
            return
        except BaseException:
            release()
            raise
        result.phase_seconds["child_wait"] = time.perf_counter() - wait_started
        paused_before = child.paused_seconds
        result.sandbox = {key: child.ready_info.get(key) for key in SANDBOX_RECORD}
        companion = self._companion(task)
        session = SandboxSession(
            child,
            self.config.timeout_s,
            self.config.host_memory_bytes,
            self._gpu_share(plan),
            companion,
        )
        if session.gpu is not None:
            result.sandbox["gpu_memory_watch"] = session.gpu.watch.describe()
        try:
            self._run_in_child(task, source, own_names, session, result, plan)
        except ChildDied as exc:
            if not (exc.ours or session.solution_sent or task.trusted):
                raise TaskError(f"task {task.id}: its sandbox child {exc} loading it") from exc
            child_lost(str(exc), exc.ours, session.solution_sent, exc.timed_out).apply(result)
            tail = child.output_tail(600).strip()
            if tail and result.status is not Status.HARNESS_ERROR:
                result.error += f"\nlast output:\n{tail}"
        except torch.OutOfMemoryError as exc:
            harness_error(
                result,
                "the trusted side ran out of GPU memory computing or comparing the reference "
                f"({str(exc).splitlines()[0]})",
            )
        except TrustedWorkFailed as exc:
            harness_error(result, f"the trusted side failed computing or comparing ({exc})")
        except (KeyError, TypeError, ValueError, OSError, RuntimeError) as exc:
            if isinstance(exc, TaskError):
                raise
            # The child is untrusted once it has the solution: a report we cannot read is then
            # its failure, never a pass; before, only our code (and the task's) ran there.
            why = f"the sandbox reported unreadable results ({type(exc).__name__}: {exc})"
            if session.solution_sent:
                result.status, result.error = Status.RUNTIME_ERROR, why
            elif task.trusted:
                harness_error(result, why)
            else:
                raise TaskError(f"task {task.id}: {why}") from exc
        finally:
            # Wall time the child's own phases (first call, compile) include but did not spend:
            # it was held paused while other evaluations were measured.
            result.phase_seconds["paused_for_others"] = child.paused_seconds - paused_before
            then = counted_until_exit(self.gpu_memory, session.gpu, child.pids(), release)
            if session.gpu is not None:  # how much of the plan the solution used
                result.sandbox["gpu_memory_share"] = session.gpu.record()
            self.children.retire(child, then=then)
            if companion is not None:
                companion.retire(self.children.retire, result.sandbox)

    def _gpu_share(self, plan: MemoryPlan | None) -> GpuShare | None:
        """The GPU memory the child is held to (a GPU task whose footprint was measured)."""
        if plan is None or not plan.measured or self.device_kind != "cuda":
            return None
        return GpuShare(watch_for(self.device), plan.child_bytes)

    def _compare(
        self,
        task: Task,
        session: SandboxSession,
        report: dict[str, Any],
        expected: list[Any],
        index: int,
        reference: Any = None,
        seed: int | None = None,
    ) -> Comparison:
        """One call's outputs, read chunk by chunk and compared where the reference lives; a
        trusted task's ``reference`` and input ``seed`` let the information check rerun it."""
        rerun = None
        if reference is not None and seed is not None and task.trusted:
            lock = self._trusted_gpu_work
            rerun = reference_rerun(self.references.runner, task, reference, seed, lock)
        matcher = OutputMatcher(task, expected, index, rerun=rerun)
        described = report["outputs"]
        matcher.check_description(described)
        if matcher.result.problems:  # wrong count, shape or dtype: no need for the values
            return matcher.finish()

        def compare_chunk(output: int, chunk: torch.Tensor) -> None:
            with trusted_work(_SAYS_WHOSE):  # in the read's turn of the GPU lock
                matcher.add_chunk(output, chunk)

        into = self.device if self.device_kind == "cuda" else None
        session.read_tensors(described, compare_chunk, into, self._trusted_gpu_work)
        return matcher.finish()

    # ------------------------------------------------------------------ device sharing
    @contextlib.contextmanager
    def _trusted_gpu_work(self) -> Iterator[None]:
        """This process's own GPU work (references, comparisons) never overlaps a measurement,
        and what it raises is ours (``attribution.trusted_work``)."""
        lock = self.gpu_lock.trusted() if self.device_kind == "cuda" else contextlib.nullcontext()
        with lock, trusted_work(_SAYS_WHOSE):
            yield

    @contextlib.contextmanager
    def _device_to_itself(
        self, measured: SandboxSession, phases: dict[str, float] | None = None
    ) -> Iterator[Sharing]:
        """The GPU, and the CPU that feeds it, for ``measured`` alone: every other sandbox of
        this device (evaluations in flight and spares still starting) is paused meanwhile.
        Yields what the measurement shares the GPU with: nobody once the GPU is found quiet,
        or unknown when it was not within ``gpu_quiet_timeout_s``.

        Other evaluations' correctness runs would otherwise make the profiled kernel time
        disagree with the timed one and spread the timings (docs/decisions.md). A paused child
        launches nothing new, but kernels it queued before the pause still run, for as long as
        they were written to run: a neighbour could slow this measurement on purpose, so the
        worker probes until the GPU is quiet (``gpu_quiet``) rather than trusting a fixed wait.
        """
        if self.device_kind != "cuda":
            yield Sharing()
            return
        phases = {} if phases is None else phases
        asked = time.perf_counter()
        with self.gpu_lock:
            # gpu_wait: queued behind other measurements; gpu_pause: pausing the others;
            # gpu_quiet: until their queued kernels were found done; gpu_exclusive: the whole
            # time the other sandboxes were held (pause included).
            held = time.perf_counter()
            phases["gpu_wait"] = held - asked
            with self.children.paused_except(measured.child):
                paused = time.perf_counter()
                phases["gpu_pause"] = paused - held
                try:
                    sharing = self._quiet_gpu("the solution")
                    phases["gpu_quiet"] = time.perf_counter() - paused
                    yield sharing
                finally:
                    phases["gpu_exclusive"] = time.perf_counter() - held

    @contextlib.contextmanager
    def _reference_alone(self, measured: SandboxSession) -> Iterator[Sharing]:
        """The measured child paused as well while the worker times its reference (the other
        sandboxes already are), and the GPU found to run nothing of theirs (``gpu_quiet``):
        what a measurement made meanwhile shares the GPU with (nobody, or unknown).

        The child's own phases are not running then (it waits for its next command), so the
        pause is not counted in its ``paused_for_others``."""
        measured.child.pause(for_others=False)
        try:
            yield self._quiet_gpu("the reference")
        finally:
            measured.child.resume()

    def _quiet_gpu(self, timed: str) -> Sharing:
        """Nobody, once no other evaluator holds a claim on the GPU (``gpu_claim``) and it is
        found running no sandbox's work (``gpu_quiet``); else who, or unknown. Asked with the
        sandboxes paused, before ``timed`` is timed. Another evaluator's claim is looked at
        first: its work does not stop for our pauses, so no wait would see the GPU quiet, and
        a measurement beside it is unused anyway (a reference's is not cached)."""
        claims = self.gpu_claim.survey() if self.gpu_claim else Sharing()
        if not claims.alone:
            return claims
        timeout_s = self.config.gpu_quiet_timeout_s
        if self.quiet is None or self.quiet.wait(timeout_s) is not None:
            return Sharing()
        return Sharing(
            unknown=f"the GPU was not found quiet within {timeout_s:g} s of pausing the "
            f"sandboxes, when {timed} was to be timed ({self.quiet.describe_last_wait()})"
        )

    @staticmethod
    def _violate(result: EvalResult, violations: list[tuple[str, str]]) -> None:
        result.status = Status.INTEGRITY_VIOLATION
        result.checks_failed = sorted({name for name, _ in violations})
        result.error = "\n".join(f"[{name}] {why}" for name, why in violations)
        result.speedup_vs_eager = result.speedup_vs_compile = None

    def _reference_timing(
        self,
        task: Task,
        compiled: bool,
        timing: TimingConfig,
        measured: SandboxSession,
        timers: dict[str, PlacementTimer | None],
    ) -> tuple[TimingStats | None, Sharing]:
        """The reference's timing and what its measurement shared the GPU with. The caller
        holds the GPU lock; a measurement is made with every sandbox paused and the GPU found
        quiet (``_reference_alone``), the same way (placements included) as the solution's,
        on the timer prepared before the window where there is one (``timers``). A trusted
        task's is cached (``cache_reference_timing``), and only when it was timed alone; an
        untrusted task's is its child's own report, never cached."""
        kind = "compile" if compiled else "eager"
        key = None
        if task.trusted and self.config.cache_reference_timing:
            key = self.timing_cache.key(task, self.device, kind, timing)
            cached = self.timing_cache.get(key)
            if cached is not False:
                return cached, Sharing()
        with self._reference_alone(measured) as sharing:
            if not sharing.alone:
                return None, sharing
            if kind in timers:
                timer = timers[kind]
                stats = None if timer is None else timer.time_all()
            else:
                stats = self.references.time(task, compiled, timing)
        if key is not None:
            self.timing_cache.put(key, stats)
        if self.device_kind == "cuda":
            torch.cuda.empty_cache()  # what the reference held goes back to the other sandboxes
        return stats, sharing


def new_result(
    task: Task, completion: str, device: str, device_name: str, versions: dict[str, str]
) -> EvalResult:
    """The record of one evaluation of ``completion`` on ``task`` before any stage ran (status
    ``correct`` until a stage says otherwise). The one constructor of a verdict: the Evaluator
    fills it in, and pools build the verdicts they give themselves (a worker lost, a deadline,
    a closed pool) from it, so those carry the same identity fields as any other."""
    return EvalResult(
        task_id=task.id,
        backend=task.backend,
        status=Status.CORRECT,
        device=device,
        device_name=device_name,
        versions=dict(versions),
        task_hash=task.hash,
        solution_hash=hashlib.sha256(completion.encode()).hexdigest()[:16],
        timestamp=time.time(),
    )


def finish_result(result: EvalResult, seconds: float) -> EvalResult:
    """Total time and the feedback text for the model: the last step of every verdict."""
    result.phase_seconds["total"] = seconds
    result.feedback = build_feedback(result)
    return result


def check_statically(
    task: Task, completion: str, result: EvalResult, static_checks: bool = True
) -> str | None:
    """Parse and static integrity checks, the stages that run nothing: the solution's source
    when they pass; else None, with the verdict (``format_error`` / ``integrity_violation``)
    written into ``result``. The Ray pool's pre-check runs exactly this, off the GPU workers."""
    try:
        source = extract_solution(completion)
    except FormatError as exc:
        result.status, result.error = Status.FORMAT_ERROR, str(exc)
        return None
    failures = run_static_checks(source, task.backend, task.source) if static_checks else []
    if failures and all(f.name in NOT_HACKS for f in failures):
        result.status = Status.COMPILE_ERROR
        result.error = "\n".join(f"[{f.name}] {f.message}" for f in failures)
        return None
    if failures:
        result.status = Status.INTEGRITY_VIOLATION
        result.checks_failed = sorted({f.name for f in failures})
        result.error = "\n".join(f"[{f.name}] {f.message}" for f in failures)
        return None
    return source
