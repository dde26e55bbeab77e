"""One evaluation, end to end, on the trusted side.

parse -> static checks -> sandboxed child (load/compile, correctness calls) while the worker
computes references -> comparison and dynamic checks -> timing and CUPTI profile (GPU, one
solution at a time per GPU) -> reference timings (cached) -> EvalResult with feedback.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from kernelrl.env.admission import GpuMemoryBudget, MemoryPlan, memory_plan
from kernelrl.env.backends import get_backend, solution_kernel_names
from kernelrl.env.compare import Comparison, OutputMatcher
from kernelrl.env.feedback import build_feedback
from kernelrl.env.gpu_claim import GpuClaim
from kernelrl.env.integrity import dynamic_checks
from kernelrl.env.integrity.static_checks import NOT_HACKS, run_static_checks
from kernelrl.env.parse import FormatError, extract_solution
from kernelrl.env.reference import (
    ReferenceRunner,
    ReferenceTimingCache,
    device_name,
    library_versions,
)
from kernelrl.env.result import EvalResult, Status, TimingStats
from kernelrl.env.sandbox import harness
from kernelrl.env.sandbox.child_process import ChildDied
from kernelrl.env.sandbox.processes import ChildPool
from kernelrl.env.sandbox.session import SandboxSession
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
    host_memory_bytes: int = 16 * 2**30
    gpu_memory_fraction: float = 0.9
    file_bytes: int = 4 * 2**30
    spare_children: int = 1
    # After pausing the other sandboxes on the GPU, wait this long for the kernels they had
    # already queued (at most one forward call each: the harness synchronises after every call).
    measurement_settle_s: float = 0.05
    # Let sandboxes still importing torch run during a measurement (sandbox.processes.ChildPool).
    run_importing_during_measurement: bool = False
    # Off only to test that the sandbox and the dynamic checks hold on their own.
    static_checks: bool = True
    timing: TimingConfig = field(default_factory=TimingConfig)

    def resolved_device(self) -> str:
        return resolve_device(self.device)


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


class Evaluator:
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
        in_flight: int = 4,
    ) -> None:
        """``in_flight``: evaluations its pool runs at once on this device (each holds a
        sandbox's CUDA context, as do the spares), for the GPU memory budget."""
        self.config = config or EvalConfig()
        self.device_kind = self.config.resolved_device()
        self.device = (
            torch.device("cuda", gpu_index) if self.device_kind == "cuda" else torch.device("cpu")
        )
        self.children = ChildPool(
            self.device_kind,
            gpu_index if self.device_kind == "cuda" else None,
            self.config.spare_children,
            pause_importing=not self.config.run_importing_during_measurement,
        )
        self.references = ReferenceRunner(self.device)
        self.gpu_memory = (
            # Sandboxes holding a context: the evaluations in flight and the spares warming.
            GpuMemoryBudget.for_device(
                self.device, processes=in_flight + self.config.spare_children
            )
            if self.device_kind == "cuda"
            else None
        )
        # Other evaluators on this GPU time each other's kernels (gpu_claim.py).
        self.gpu_claim = GpuClaim.for_device(self.device) if self.device_kind == "cuda" else None
        self.timing_cache = timing_cache or ReferenceTimingCache()
        self.gpu_lock = threading.Lock()
        self.versions = library_versions()
        self.device_name = device_name(self.device)

    def warm(self) -> None:
        self.children.warm()

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
        try:
            self._run(task, completion, result)
        finally:
            finish_result(result, time.perf_counter() - started)
        return result

    def _run(self, task: Task, completion: str, result: EvalResult) -> None:
        source = check_statically(task, completion, result, self.config.static_checks)
        if source is None:
            return
        own_names = solution_kernel_names(source, task.backend)

        plan = memory_plan(task) if self.gpu_memory is not None else None
        waited = time.perf_counter()
        release = self.gpu_memory.acquire(plan.total_bytes) if plan else _nothing_reserved
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
        result.sandbox = {
            key: child.ready_info.get(key)
            for key in (
                "network",
                "isolation",
                "import_seconds",
                "cuda_init_seconds",
                "profiler_init_seconds",
                "audit_init_seconds",
                "gate_seconds",
                "import_cpu_seconds",
                "cpu_seconds",
            )
        }
        session = SandboxSession(child, self.config.timeout_s, self.config.host_memory_bytes)
        try:
            self._run_in_child(task, source, own_names, session, result, plan)
        except ChildDied as exc:
            if exc.ours:
                harness_error(result, f"the sandbox child {exc}")
                return
            result.status = Status.TIMEOUT if exc.timed_out else Status.RUNTIME_ERROR
            result.error = f"the solution's process {exc}"
            tail = child.output_tail(600).strip()
            if tail:
                result.error += f"\nlast output:\n{tail}"
        except torch.OutOfMemoryError as exc:
            harness_error(
                result,
                "the trusted side ran out of GPU memory computing or comparing the reference "
                f"({str(exc).splitlines()[0]})",
            )
        except (KeyError, TypeError, ValueError, OSError, RuntimeError) as exc:
            if isinstance(exc, TaskError):
                raise
            # The child is untrusted: a report we cannot read is its failure, never a pass.
            result.status = Status.RUNTIME_ERROR
            result.error = f"the sandbox reported unreadable results ({type(exc).__name__}: {exc})"
        finally:
            self.children.retire(child, then=release)

    def _run_in_child(
        self,
        task: Task,
        source: str,
        own_names: list[str],
        session: SandboxSession,
        result: EvalResult,
        plan: MemoryPlan | None,
    ) -> None:
        config = self.config
        timing_config = (
            replace(config.timing, placements=1) if plan and plan.large else config.timing
        )
        model_seed = secrets.randbits(31)
        loaded = session.start(
            {
                "device": str(self.device) if self.device_kind == "cpu" else "cuda:0",
                "backend": task.backend,
                "task_source": task.source,
                "size_overrides": task.size_overrides(self.device_kind),
                "solution_source": source,
                "model_seed": model_seed,
                "timing": asdict(timing_config),
                "profile_calls": config.profile_calls,
                "gpu_bytes_admitted": plan.child_bytes if plan else None,
                "check_timed_outputs": True,
                "stop_at_compute": True,
                "limits": {
                    "file_bytes": config.file_bytes,
                    "cpu_seconds": int(config.timeout_s * 2) + 30,
                    "address_space_bytes": config.host_memory_bytes,
                    "gpu_memory_fraction": config.gpu_memory_fraction,
                },
            },
        )
        result.phase_seconds.update({f"child_{k}": v for k, v in loaded.get("phase", {}).items()})
        if self._stopped_early(loaded, result):
            return
        violations = dynamic_checks.check_tampering(loaded["tampered"])
        violations += dynamic_checks.check_init_compute(
            loaded.get("init_compute", {}), self.references.init_compute(task)
        )
        if violations:
            self._violate(result, violations)
            return

        evidence = dynamic_checks.CallEvidence()
        glue_is_task = dynamic_checks.glue_can_be_the_task(task.source)
        started = time.perf_counter()
        with self._trusted_gpu_work():
            reference = self.references.model(task, model_seed)
        result.phase_seconds["reference"] = time.perf_counter() - started
        for index in range(config.num_input_sets):
            seed = secrets.randbits(31)
            session.send_call(seed)
            started = time.perf_counter()
            with self._trusted_gpu_work():  # computed while the child runs the same inputs
                expected = self.references.output(task, reference, seed)
            result.phase_seconds["reference"] += time.perf_counter() - started
            report = session.receive()
            if self._stopped_early(report, result):
                return
            started = time.perf_counter()
            comparison = self._compare(task, session, report, expected, index)
            result.phase_seconds["compare"] = result.phase_seconds.get("compare", 0.0) + (
                time.perf_counter() - started
            )
            expected_dtypes = {v.dtype for v in expected if isinstance(v, torch.Tensor)}
            del expected
            if plan and plan.large:  # give the cached blocks back to the other sandboxes
                with self._trusted_gpu_work():
                    torch.cuda.empty_cache()
            evidence.add(report)
            result.input_sets_checked = index + 1
            result.max_abs_err = max(result.max_abs_err or 0.0, comparison.max_abs_err)
            result.max_rel_err = max(result.max_rel_err or 0.0, comparison.max_rel_err)
            violations = dynamic_checks.check_calls(
                evidence, task.backend, glue_is_task=glue_is_task
            )
            if violations:
                self._violate(result, violations)
                return
            if not comparison.correct:
                result.status = Status.INCORRECT
                result.error = "\n".join(comparison.problems[:3])
                if _looks_like_reduced_precision(expected_dtypes, comparison):
                    result.error += "\n" + REDUCED_PRECISION_HINT
                return
        result.phase_seconds.update({f"child_{k}": v for k, v in report.get("phase", {}).items()})
        result.custom_kernel_launches = (
            min(evidence.launches)
            if evidence.launches and get_backend(task.backend).counts_launches
            else None
        )

        timing_seed = secrets.randbits(31)
        sharers = set(self.gpu_claim.others()) if self.gpu_claim else set()
        with self._device_to_itself(session, result.phase_seconds) as settle_until:
            timing_started = time.perf_counter()
            session.send_time(timing_seed, max(settle_until - timing_started, 0.0))
            timing = session.receive()
            timing_wall = time.perf_counter() - timing_started
            result.phase_seconds.update(
                {f"child_{k}": v for k, v in timing.get("phase", {}).items()}
            )
            if self._stopped_early(timing, result):
                return
            result.runtime = TimingStats(**timing["runtime"])
            started = time.perf_counter()
            result.ref_eager = self._reference_timing(task, False, timing_config)
            if self.device_kind == "cuda" and config.time_reference_compile:
                result.ref_compile = self._reference_timing(task, True, timing_config)
            result.phase_seconds["reference_timing"] = time.perf_counter() - started
        if self.gpu_claim:
            sharers.update(self.gpu_claim.others())
        # How the timed calls computed is judged before what they answered: a broken rule (work
        # on a side stream, say) also makes kept outputs wrong, and the rule is the finding.
        violations = dynamic_checks.check_timing_report(timing, task.backend, timing_wall)
        if violations:
            self._violate(result, violations)
            return
        result.timing_meaningful = self.device_kind == "cuda" and not sharers
        if sharers:
            result.sandbox["gpu_shared_with"] = sorted(sharers)
        if self.device_kind != "cuda":
            violations = dynamic_checks.check_cpu_profile(timing["profile"])
        else:
            summary = dynamic_checks.summarize_profile(timing["profile"], own_names)
            result.kernels = summary["kernels"]
            result.own_kernel_share = summary["own_share"]
            result.custom_kernel_launches = round(summary["own_launches_per_call"])
            violations = dynamic_checks.check_gpu_profile(
                timing["profile"],
                summary,
                result.runtime.median_ms,
                glue_is_task=glue_is_task,
                timed_alone=not sharers,
            )
        if violations:
            self._violate(result, violations)
            return
        if not self._timed_outputs_correct(task, session, timing, reference, timing_seed, result):
            return
        if result.timing_meaningful:
            result.speedup_vs_eager = _speedup(result.ref_eager, result.runtime)
            result.speedup_vs_compile = _speedup(result.ref_compile, result.runtime)

    def _timed_outputs_correct(
        self,
        task: Task,
        session: SandboxSession,
        timing: dict[str, Any],
        reference: torch.nn.Module,
        timing_seed: int,
        result: EvalResult,
    ) -> bool:
        """The outputs the child kept of its timed calls (one call per input set, drawn after
        the call returned), compared here with the reference on the same input contents, remade
        from their seed: timed calls are held to the same answer as the checked ones."""
        for entry in timing.get("checked_outputs", []):
            index = int(entry["input_set"])
            seed = harness.timed_input_seed(
                timing_seed, index, int(entry["version"]), int(timing["placements_asked"])
            )
            with self._trusted_gpu_work():
                expected = self.references.output(task, reference, seed)
            comparison = self._compare(task, session, entry, expected, index)
            del expected
            if not comparison.correct:
                result.status = Status.INCORRECT
                result.error = (
                    f"the output kept from a timed call (input set {index}) does not match the "
                    "reference: " + "\n".join(comparison.problems[:3])
                )
                return False
        return True

    def _compare(
        self,
        task: Task,
        session: SandboxSession,
        report: dict[str, Any],
        expected: list[Any],
        index: int,
    ) -> Comparison:
        """One call's outputs, read chunk by chunk and compared where the reference lives."""
        matcher = OutputMatcher(task, expected, index)
        described = report["outputs"]
        matcher.check_description(described)
        if matcher.result.problems:  # wrong count, shape or dtype: no need for the values
            return matcher.finish()

        def compare_chunk(output: int, chunk: torch.Tensor) -> None:
            with self._trusted_gpu_work():
                matcher.add_chunk(output, chunk)

        session.read_tensors(described, compare_chunk)
        return matcher.finish()

    # ------------------------------------------------------------------ device sharing
    def _trusted_gpu_work(self) -> contextlib.AbstractContextManager:
        """This process's own GPU work (references, comparisons) never overlaps a measurement."""
        return self.gpu_lock if self.device_kind == "cuda" else contextlib.nullcontext()

    @contextlib.contextmanager
    def _device_to_itself(
        self, measured: SandboxSession, phases: dict[str, float] | None = None
    ) -> Iterator[float]:
        """The GPU, and the CPU that feeds it, for ``measured`` alone: every other sandbox of
        this device (evaluations in flight and spares still starting) is paused meanwhile.
        Yields when the first timed call may start (``time.perf_counter``).

        Other evaluations' correctness runs would otherwise make the profiled kernel time
        disagree with the timed one and spread the timings (docs/decisions.md). A paused child
        launches nothing new, but kernels it queued before the pause still run: the settle time
        covers a neighbour's forward call of up to ``measurement_settle_s``, and the measured
        child spends it warming up (``time_cuda``'s ``settle_until``), not waiting for it.
        """
        if self.device_kind != "cuda":
            yield 0.0
            return
        phases = {} if phases is None else phases
        asked = time.perf_counter()
        with self.gpu_lock:
            # gpu_wait: queued behind other measurements; gpu_pause: pausing the others;
            # gpu_exclusive: the whole time the other sandboxes were held (pause included).
            held = time.perf_counter()
            phases["gpu_wait"] = held - asked
            with self.children.paused_except(measured.child) as paused_any:
                paused = time.perf_counter()
                phases["gpu_pause"] = paused - held
                try:
                    yield paused + (self.config.measurement_settle_s if paused_any else 0.0)
                finally:
                    phases["gpu_exclusive"] = time.perf_counter() - held

    def _stopped_early(self, message: dict[str, Any], result: EvalResult) -> bool:
        kind = message["type"]
        if kind == "error":
            stage = message.get("stage")
            # The task loaded and made its inputs on the trusted side: when it cannot in the
            # sandbox, our limits or environment differ there, which is ours to fix.
            ours = stage in ("harness", "task", "inputs")
            result.status = (
                Status.HARNESS_ERROR
                if ours
                else {"compile": Status.COMPILE_ERROR}.get(stage, Status.RUNTIME_ERROR)
            )
            result.error = str(message.get("error", ""))
            if ours:
                harness_error(result, f"the harness failed inside the sandbox: {result.error}")
            return True
        if kind == "not_run":
            result.status = Status.NOT_RUN
            result.error = str(message.get("reason", ""))
            return True
        if kind == "compute_seen":
            self._violate(result, dynamic_checks.check_stopped_call(message))
            return True
        return False

    @staticmethod
    def _violate(result: EvalResult, violations: list[tuple[str, str]]) -> None:
        result.status = Status.INTEGRITY_VIOLATION
        result.checks_failed = sorted({name for name, _ in violations})
        result.error = "\n".join(f"[{name}] {why}" for name, why in violations)
        result.speedup_vs_eager = result.speedup_vs_compile = None

    def _reference_timing(
        self, task: Task, compiled: bool, timing: TimingConfig
    ) -> TimingStats | None:
        """Cached; the caller holds the GPU lock so the reference is timed alone, the same way
        (placements included) as the solution."""
        kind = "compile" if compiled else "eager"
        key = self.timing_cache.key(task, self.device, kind, timing)
        cached = self.timing_cache.get(key)
        if cached is not False:
            return cached
        stats = self.references.time(task, compiled, timing)
        self.timing_cache.put(key, stats)
        if self.device_kind == "cuda":
            torch.cuda.empty_cache()  # what the reference held goes back to the other sandboxes
        return stats


REDUCED_PRECISION_HINT = (
    "The mismatches are small next to the output's values, as when fp32 is computed in a lower "
    "precision: tl.dot's default input_precision is TF32 on GPUs (~1e-3 relative error), while "
    "fp32 tasks are checked against an exact fp32 reference (TF32 off) at fp32 tolerances "
    '(KernelBench\'s 1e-4 by default). Use tl.dot(a, b, input_precision="ieee") (or '
    '"tf32x3"), and accumulate in fp32.'
)


def _looks_like_reduced_precision(dtypes: set[torch.dtype], comparison: Comparison) -> bool:
    """fp32 outputs whose only problems are values off by less than 1% of the output's scale:
    what TF32 (10-bit mantissa) or bf16 products give, rather than a wrong algorithm."""
    return (
        torch.float32 in dtypes
        and all("values outside" in problem for problem in comparison.problems)
        and 0 < comparison.max_abs_err < 0.01 * comparison.ref_scale
    )


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


def _nothing_reserved() -> None:
    """The release of an evaluation admitted without a memory reservation (CPU)."""


def finish_result(result: EvalResult, seconds: float) -> EvalResult:
    """Total time and the feedback text for the model: the last step of every verdict."""
    result.phase_seconds["total"] = seconds
    result.feedback = build_feedback(result)
    return result


def harness_error(result: EvalResult, why: str) -> None:
    """Our failure, said as ours: the solution is neither blamed nor rewarded for it."""
    result.status = Status.HARNESS_ERROR
    result.error = f"kernelrl harness error (not the solution's fault): {why}"


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


def _speedup(reference: TimingStats | None, solution: TimingStats | None) -> float | None:
    if reference is None or solution is None or solution.median_ms <= 0:
        return None
    return reference.median_ms / solution.median_ms
