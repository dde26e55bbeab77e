"""One evaluation's conversation with its sandbox child, phase by phase, on the trusted side:
load (task, then solution), the checked calls, the measurement (timing and profile), the outputs
kept of timed calls; and whose failure each early stop is (``attribution``).

``ChildRunPhases`` is mixed into ``Evaluator`` (``env/evaluator.py``), which provides what the
phases use: ``config``, ``device``, ``device_kind``, ``references``, ``gpu_claim`` and its
helpers ``_compare``, ``_violate``, ``_trusted_gpu_work``, ``_device_to_itself``,
``_reference_alone`` and ``_reference_timing``.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict
from typing import Any

import torch

from kernelrl.env import attribution, sizes
from kernelrl.env.admission import MemoryPlan
from kernelrl.env.backends import get_backend
from kernelrl.env.compare import Comparison
from kernelrl.env.gpu_claim import Sharing
from kernelrl.env.integrity import dynamic_checks
from kernelrl.env.reference import REFERENCE_KINDS, PlacementTimer
from kernelrl.env.result import EvalResult, Status, TimingStats
from kernelrl.env.sandbox import harness
from kernelrl.env.sandbox.companion import Companion, child_report
from kernelrl.env.sandbox.session import SandboxSession
from kernelrl.env.side_by_side import InterleavedReference
from kernelrl.env.single_flight import SingleFlight
from kernelrl.env.task import Task, TaskError
from kernelrl.env.timing import TimingConfig, fitted, placements

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


def _speedup(reference: TimingStats | None, solution: TimingStats | None) -> float | None:
    if reference is None or solution is None or solution.median_ms <= 0:
        return None
    return reference.median_ms / solution.median_ms


def _charge(result: EvalResult, phase: str, started: float) -> None:
    """Add the time since ``started`` to ``phase``, which several steps share."""
    seconds = result.phase_seconds
    seconds[phase] = seconds.get(phase, 0.0) + time.perf_counter() - started


def _take_child_record(message: dict[str, Any], result: EvalResult) -> None:
    """The child's phases, and what its compile companion did for it (its own word, kept
    for the record only: nothing is decided on it)."""
    result.phase_seconds.update({f"child_{k}": v for k, v in message.get("phase", {}).items()})
    if "compile_ahead" in message:
        record = result.sandbox.setdefault("compile_ahead", {})
        record.update(child_report(message["compile_ahead"]))


class ChildRunPhases:
    """The phases of ``Evaluator._run_in_child`` (see the module's docstring)."""

    # Provided by ``Evaluator``.
    config: Any
    device: torch.device
    device_kind: str
    references: Any
    gpu_claim: Any
    children: Any
    _compare: Callable[..., Comparison]
    _violate: Callable[[EvalResult, list[tuple[str, str]]], None]
    _trusted_gpu_work: Callable[[], AbstractContextManager]
    _device_to_itself: Callable[..., AbstractContextManager[Sharing]]
    _reference_alone: Callable[[SandboxSession], AbstractContextManager[Sharing]]
    _reference_timing: Callable[
        [Task, bool, TimingConfig, SandboxSession, dict[str, PlacementTimer | None]],
        tuple[TimingStats | None, Sharing],
    ]
    timing_cache: Any
    reference_timings_in_flight: SingleFlight | None

    def _run_in_child(
        self,
        task: Task,
        source: str,
        own_names: list[str],
        session: SandboxSession,
        result: EvalResult,
        plan: MemoryPlan | None,
    ) -> None:
        timing_config = self._timing_config(plan)
        model_seed = self.references.model_seed(task)  # an untrusted reference's child has it
        loaded = session.start(self._child_job(task, source, model_seed, timing_config))
        _take_child_record(loaded, result)
        if self._stopped_early(loaded, result, session, task):
            return
        violations = dynamic_checks.check_tampering(loaded["tampered"])
        violations += dynamic_checks.check_init_compute(
            loaded.get("init_compute", {}), self.references.init_compute(task)
        )
        if violations:
            self._violate(result, violations)
            return
        glue_is_task = dynamic_checks.glue_can_be_the_task(task.source)
        reference = self._checked_calls(task, session, result, plan, model_seed, glue_is_task)
        if reference is not None:
            self._timed_phase(
                task, own_names, session, result, reference, timing_config, glue_is_task
            )

    def _companion(self, task: Task) -> Companion | None:
        """A compile companion for a Triton solution on a GPU, where the config asks for one
        (``sandbox.compiler``), held to the limits its child is."""
        if not (self.config.compile_ahead and self.device_kind == "cuda"):
            return None
        if task.backend != "triton":
            return None
        return Companion(self.device_kind, self.children.gpu_index, self._sandbox_limits())

    def _timing_config(self, plan: MemoryPlan | None) -> TimingConfig:
        """The timing procedure, on no more input sets than the memory plan counted."""
        timing = self.config.timing
        return timing if plan is None else fitted(timing, plan.placements)

    def _child_job(
        self, task: Task, source: str, model_seed: int, timing: TimingConfig
    ) -> dict[str, Any]:
        config = self.config
        return {
            "device": str(self.device) if self.device_kind == "cpu" else "cuda:0",
            "backend": task.backend,
            "task_source": task.source,
            "size_overrides": sizes.size_overrides(task, self.device_kind),
            "solution_source": source,
            "model_seed": model_seed,
            "timing": asdict(timing),
            "profile_calls": config.profile_calls,
            "probe_inputs": True,  # the inputs are shown to fit before the solution is loaded
            "check_timed_outputs": True,
            "interleave": self._interleaves(task),
            "stop_at_compute": True,
            "limits": self._sandbox_limits(),
        }

    def _sandbox_limits(self) -> dict[str, Any]:
        """What a sandbox process of this evaluator may use: its child and its companion."""
        config = self.config
        return {
            "file_bytes": config.file_bytes,
            "cpu_seconds": int(config.timeout_s * 2) + 30,
            "address_space_bytes": config.host_memory_bytes,
            "gpu_memory_fraction": config.gpu_memory_fraction,
        }

    def _checked_calls(
        self,
        task: Task,
        session: SandboxSession,
        result: EvalResult,
        plan: MemoryPlan | None,
        model_seed: int,
        glue_is_task: bool,
    ) -> Any | None:
        """The correctness calls, each on new inputs compared with the reference's outputs; the
        reference model, or None once one of the calls decided the verdict. The reference and
        its outputs are made while the child runs: with the first call (its compile), the outputs
        of ``plan.outputs_ahead`` calls in one turn of the GPU lock, so that the later calls are
        compared as soon as the child answers, not after a wait for the lock behind other
        evaluations' measurements."""
        seeds = [secrets.randbits(31) for _ in range(self.config.num_input_sets)]
        ahead = plan.outputs_ahead if plan is not None else len(seeds)
        evidence = dynamic_checks.CallEvidence()
        report: dict[str, Any] = {}
        reference: Any = None
        made: list[list[Any]] = []
        for index, seed in enumerate(seeds):
            paused_before = session.child.paused_seconds
            session.send_call(seed)
            if not made:  # made while the child runs the same inputs
                started = time.perf_counter()
                batch, lock = seeds[index : index + ahead], self._trusted_gpu_work
                if reference is None:
                    reference, made = self.references.model_and_outputs(
                        task, model_seed, batch, lock
                    )
                else:
                    made = self.references.outputs(task, reference, batch, lock)
                _charge(result, "reference", started)
            expected = made.pop(0)
            report = session.receive()
            if index == 0:  # how much of the child's first call (its compile) was a pause
                paused = session.child.paused_seconds - paused_before
                result.phase_seconds["first_call_paused"] = paused
            if self._stopped_early(report, result, session, task):
                return None
            started = time.perf_counter()
            comparison = self._compare(task, session, report, expected, index, reference, seed)
            _charge(result, "compare", started)
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
                return None
            if not comparison.correct:
                result.status = Status.INCORRECT
                result.error = "\n".join(comparison.problems[:3])
                if _looks_like_reduced_precision(expected_dtypes, comparison):
                    result.error += "\n" + REDUCED_PRECISION_HINT
                return None
        _take_child_record(report, result)
        result.custom_kernel_launches = (
            min(evidence.launches)
            if evidence.launches and get_backend(task.backend).counts_launches
            else None
        )
        return reference

    def _timed_phase(
        self,
        task: Task,
        own_names: list[str],
        session: SandboxSession,
        result: EvalResult,
        reference: Any,
        timing_config: TimingConfig,
        glue_is_task: bool,
    ) -> None:
        """The measurement (the device to itself), then its verdicts: how the timed calls
        computed, then what they answered."""
        timing_seed = secrets.randbits(31)
        with (
            self._reference_prepared(task, timing_config, result.phase_seconds, session) as timers,
            self._device_to_itself(session, result.phase_seconds) as sharing,
            self._side_by_side(task, timing_config, session, timers) as side_by_side,
        ):
            timing, timing_wall = self._time_solution(session, timing_seed, side_by_side)
            if session.gpu is not None:
                result.sandbox["gpu_clocks"] = session.gpu.watch.clocks()
            _take_child_record(timing, result)
            if self._stopped_early(timing, result, session, task):
                return
            result.runtime = TimingStats.from_report(
                timing["runtime"], timing_config.most_placements
            )
            if side_by_side is not None:
                result.ref_eager, result.ref_compile, quiet = side_by_side.stats()
                sharing = sharing.merge(quiet)
                result.phase_seconds["reference_timing"] = side_by_side.seconds
            else:
                started = time.perf_counter()
                result.ref_eager, quiet = self._reference_timing(
                    task, False, timing_config, session, timers
                )
                sharing = sharing.merge(quiet)
                if sharing.alone and self._times_compiled_reference():
                    result.ref_compile, quiet = self._reference_timing(
                        task, True, timing_config, session, timers
                    )
                    sharing = sharing.merge(quiet)
                result.phase_seconds["reference_timing"] = time.perf_counter() - started
        if self.gpu_claim:  # another evaluator's work, or no way to tell: timing unused
            sharing = sharing.merge(self.gpu_claim.survey())
        # How the timed calls computed is judged before what they answered: a broken rule (work
        # on a side stream, say) also makes kept outputs wrong, and the rule is the finding.
        violations = dynamic_checks.check_timing_report(timing, task.backend, timing_wall)
        if violations:
            self._violate(result, violations)
            return
        result.timing_meaningful = self.device_kind == "cuda" and sharing.alone
        result.sandbox.update(sharing.record())
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
                timed_alone=sharing.alone,
            )
        if violations:
            self._violate(result, violations)
            return
        if timing.get("not_run") and self.device_kind == "cpu":  # a timed call needs a GPU
            attribution.not_run({"reason": timing["not_run"]}, self.device_kind).apply(result)
            return
        if not self._timed_outputs_correct(task, session, timing, reference, timing_seed, result):
            return
        if result.timing_meaningful:
            result.speedup_vs_eager = _speedup(result.ref_eager, result.runtime)
            result.speedup_vs_compile = _speedup(result.ref_compile, result.runtime)

    def _interleaves(self, task: Task) -> bool:
        """Whether the reference is timed between the solution's input sets: when it is timed
        for every evaluation and in this process (``env/side_by_side.py``)."""
        return task.trusted and not self.config.cache_reference_timing

    def _times_compiled_reference(self) -> bool:
        return self.device_kind == "cuda" and self.config.time_reference_compile

    def _reference_kinds_to_time(self, task: Task, timing: TimingConfig) -> tuple[str, ...]:
        """The reference timings this evaluation makes in this process: a trusted task's (an
        untrusted task's child times its own), eager and, on a GPU, torch.compile where asked;
        of a cached timing only the kinds the cache has none of yet."""
        if not task.trusted:
            return ()
        kinds = REFERENCE_KINDS if self._times_compiled_reference() else ("eager",)
        if self._interleaves(task):
            return kinds
        cache = self.timing_cache
        return tuple(
            k for k in kinds if cache.get(cache.key(task, self.device, k, timing)) is False
        )

    @contextlib.contextmanager
    def _reference_prepared(
        self, task: Task, timing: TimingConfig, phases: dict[str, float], session: SandboxSession
    ) -> Iterator[dict[str, PlacementTimer | None]]:
        """The reference's timers made ready before the measurement's window: its model, its
        input sets and torch.compile's compilation are this process's own work, done while the
        other sandboxes run (under the lock every trusted GPU step takes, so never during a
        measurement) rather than inside a window that holds every sandbox paused. Their memory
        goes back to the other sandboxes when the measurement ends, however it ends. A timing
        another evaluation of the task is making now is waited for, then found cached."""
        with self._reference_claimed(task, timing, session):
            kinds = self._reference_kinds_to_time(task, timing)  # looked for again after a wait
            if not kinds:
                yield {}
                return
            started = time.perf_counter()
            with self._trusted_gpu_work():
                timers = self.references.runner.timers(task, timing, kinds)
            phases["reference_prepare"] = time.perf_counter() - started
            try:
                yield timers
            finally:
                timers.clear()
                if self.device_kind == "cuda":
                    with self._trusted_gpu_work():
                        torch.cuda.empty_cache()

    @contextlib.contextmanager
    def _reference_claimed(
        self, task: Task, timing: TimingConfig, session: SandboxSession
    ) -> Iterator[None]:
        """The cached reference timings this evaluation would make, claimed until its window has
        ended (``single_flight``): while another evaluation of the task makes them, this one
        waits, holding no lock, for half of what its child's time limit has left at most (the
        limit runs on while it waits, and the rest is its own measurement's)."""
        in_flight = self.reference_timings_in_flight
        kinds = self._reference_kinds_to_time(task, timing)
        if in_flight is None or not kinds or self._interleaves(task):  # interleaved: each its own
            yield
            return
        keys = [self.timing_cache.key(task, self.device, kind, timing) for kind in kinds]
        wait_s = max(session.deadline - time.monotonic(), 0.0) / 2
        with in_flight.claim(keys, wait_s):
            yield

    @contextlib.contextmanager
    def _side_by_side(
        self,
        task: Task,
        timing: TimingConfig,
        session: SandboxSession,
        timers: dict[str, PlacementTimer | None],
    ) -> Iterator[InterleavedReference | None]:
        """The prepared reference, to take its turns between the solution's input sets; None
        where it is timed otherwise (``_interleaves``). It lets go of the timers when the
        measurement ends, so that ``_reference_prepared`` gives their memory back then, not
        when the evaluation's caller drops it."""
        if not self._interleaves(task) or timers.get("eager") is None:
            yield None
            return
        side_by_side = InterleavedReference(
            timers["eager"],
            timers.get("compile"),
            lambda: self._reference_alone(session),
            placements(self.device, timing),
        )
        try:
            yield side_by_side
        finally:
            side_by_side.timers.clear()

    @staticmethod
    def _time_solution(
        session: SandboxSession, seed: int, side_by_side: InterleavedReference | None
    ) -> tuple[dict[str, Any], float]:
        """The child's timing report, and the wall clock its own timing took: the reference's
        turns between its input sets (``side_by_side``), while it waits paused, are not its."""
        wall = 0.0
        started = time.perf_counter()
        session.send_time(seed)
        while True:
            message = session.receive()
            wall += time.perf_counter() - started
            if message["type"] != "placement_timed":
                return message, wall
            if side_by_side is None:
                raise ValueError("the sandbox reported an input set timed, which it was not asked")
            side_by_side.take_turn(message.get("index"))
            started = time.perf_counter()
            session.send_time_next()

    def _timed_outputs_correct(
        self,
        task: Task,
        session: SandboxSession,
        timing: dict[str, Any],
        reference: Any,
        timing_seed: int,
        result: EvalResult,
    ) -> bool:
        """The outputs the child kept of its timed calls (one call per input set, drawn after
        the call returned, copied when its timed span ended), compared here with the reference
        on the same input contents, remade from their seed: timed calls are held to the same
        answer as the checked ones, and to what they had written when they ended."""
        for entry in timing.get("checked_outputs", []):
            index = int(entry["input_set"])
            seed = harness.timed_input_seed(
                timing_seed, index, int(entry["version"]), int(timing["placements_asked"])
            )
            started = time.perf_counter()
            (expected,) = self.references.outputs(task, reference, [seed], self._trusted_gpu_work)
            _charge(result, "reference", started)
            started = time.perf_counter()
            comparison = self._compare(task, session, entry, expected, index, reference, seed)
            _charge(result, "compare", started)
            del expected
            if not comparison.correct:
                result.status = Status.INCORRECT
                result.error = (
                    f"the output kept from a timed call (input set {index}) does not match the "
                    "reference: " + "\n".join(comparison.problems[:3])
                )
                return False
        return True

    def _stopped_early(
        self, message: dict[str, Any], result: EvalResult, session: SandboxSession, task: Task
    ) -> bool:
        """Whether ``message`` ends the evaluation, with the verdict written into ``result``:
        whose failure an error is decides the trusted side (``attribution``), never the child."""
        kind = message["type"]
        if kind == "error":
            if not session.solution_sent and not task.trusted:
                raise TaskError(
                    f"task {task.id}: failed in the solution's sandbox before the solution was "
                    f"loaded ({message.get('stage')}): {str(message.get('error', ''))[-1500:]}"
                )
            attribution.child_error(message, session.solution_sent, session.memory_shortfall).apply(
                result
            )
            return True
        if kind == "not_run":
            violations = dynamic_checks.check_tampering(message.get("tampered", []))
            if violations:
                self._violate(result, violations)
            else:
                attribution.not_run(message, self.device_kind).apply(result)
            return True
        if kind == "compute_seen":
            self._violate(result, dynamic_checks.check_stopped_call(message))
            return True
        return False
