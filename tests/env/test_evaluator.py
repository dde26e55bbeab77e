"""Every status and every dynamic check, on CPU, with faulty and hacking solutions of our own.

The solutions in tests/solutions/dynamic/ are named ``<expected>__<what>.py``: the expected
status, or the name of the dynamic check that must catch them. They run with static checks
off, to show that the sandbox and the dynamic checks hold on their own; with static checks on,
none of the hacks may come out correct either.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernelrl.env.evaluator import EvalConfig, Evaluator
from kernelrl.env.integrity.dynamic_checks import DYNAMIC_CHECKS
from kernelrl.env.pools.local import LocalPool
from kernelrl.env.result import EvalResult, Status
from kernelrl.env.task import load_task, task_from_source

ROOT = Path(__file__).resolve().parents[2]
RELU_TASK = load_task(ROOT / "data" / "tasks" / "01_relu.py")
SOLUTIONS = sorted((Path(__file__).parents[1] / "solutions" / "dynamic").glob("*.py"))
STATUSES = {s.value for s in Status}


def expected_of(path: Path) -> str:
    return path.name.split("__")[0]


@pytest.fixture(scope="module")
def results_without_static_checks() -> dict[str, EvalResult]:
    config = EvalConfig(
        device="cpu", timeout_s=30, host_memory_bytes=2 * 2**30, static_checks=False
    )
    with LocalPool(config, workers=2) as pool:
        results = pool.evaluate([RELU_TASK] * len(SOLUTIONS), [p.read_text() for p in SOLUTIONS])
    return {p.name: r for p, r in zip(SOLUTIONS, results, strict=True)}


@pytest.fixture(scope="module")
def results_with_static_checks() -> dict[str, EvalResult]:
    config = EvalConfig(device="cpu", timeout_s=30, host_memory_bytes=2 * 2**30)
    with LocalPool(config, workers=2) as pool:
        results = pool.evaluate([RELU_TASK] * len(SOLUTIONS), [p.read_text() for p in SOLUTIONS])
    return {p.name: r for p, r in zip(SOLUTIONS, results, strict=True)}


def test_every_status_and_dynamic_check_has_a_solution() -> None:
    covered = {expected_of(p) for p in SOLUTIONS}
    # harness_error is ours, never a solution's: test_a_limit_of_ours_is_a_harness_error makes one.
    missing_statuses = (
        STATUSES
        - covered
        - {
            "format_error",
            "integrity_violation",
            "not_run",
            "harness_error",
        }
    )
    assert not missing_statuses, f"no solution exercises {missing_statuses}"
    # GPU-only evidence: streams, the CUPTI timing and its copies between device and host.
    cpu_checks = set(DYNAMIC_CHECKS) - {"side_stream", "timing_unconfirmed", "host_compute"}
    # glue_budget needs a data-movement task, not ReLU: test_dynamic_checks covers it on a cat.
    assert cpu_checks - covered - {"output_aliases_input", "glue_budget"} == set()


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_sandbox_and_dynamic_checks(
    path: Path, results_without_static_checks: dict[str, EvalResult]
) -> None:
    result = results_without_static_checks[path.name]
    expected = expected_of(path)
    if expected in STATUSES:
        assert result.status == expected, result.feedback
    else:
        assert result.status is Status.INTEGRITY_VIOLATION, result.feedback
        assert expected in result.checks_failed, result.feedback
    assert result.feedback  # every result explains itself
    if result.status is not Status.CORRECT:
        assert result.speedup_vs_eager is None


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_static_checks_stop_hacks_first(
    path: Path, results_with_static_checks: dict[str, EvalResult]
) -> None:
    result = results_with_static_checks[path.name]
    expected = expected_of(path)
    if expected == "correct":
        assert result.status is Status.CORRECT, result.feedback
    else:
        assert result.status is not Status.CORRECT, result.feedback


def test_input_mutation_also_flags_aliasing(
    results_without_static_checks: dict[str, EvalResult],
) -> None:
    result = results_without_static_checks["input_mutated__in_place.py"]
    assert {"input_mutated", "output_aliases_input"} <= set(result.checks_failed)


def test_crash_is_described(results_without_static_checks: dict[str, EvalResult]) -> None:
    assert "SIGSEGV" in results_without_static_checks["runtime_error__segfault.py"].error
    assert "memory" in results_without_static_checks["runtime_error__host_oom.py"].error.lower()
    assert "time limit" in results_without_static_checks["timeout__infinite_loop.py"].error


def test_printed_text_is_not_a_verdict(
    results_without_static_checks: dict[str, EvalResult],
) -> None:
    result = results_without_static_checks["incorrect__prints_fake_verdict.py"]
    assert result.status is Status.INCORRECT
    assert "values outside" in result.feedback


def test_compile_error_feedback_points_at_the_kernel(
    results_without_static_checks: dict[str, EvalResult],
) -> None:
    feedback = results_without_static_checks["compile_error__arange_not_power_of_two.py"].feedback
    assert "power of 2" in feedback


def test_incorrect_feedback_shows_first_mismatch(
    results_without_static_checks: dict[str, EvalResult],
) -> None:
    result = results_without_static_checks["incorrect__wrong_threshold.py"]
    assert "first at index" in result.feedback and "expected" in result.feedback
    assert result.max_abs_err is not None and result.max_abs_err > 0


def test_correct_result_is_complete(results_without_static_checks: dict[str, EvalResult]) -> None:
    result = results_without_static_checks["correct__chatty.py"]
    assert result.input_sets_checked == 3
    assert result.custom_kernel_launches == 1
    assert result.runtime is not None and not result.timing_meaningful
    assert result.speedup_vs_eager is None  # interpreter timings are not comparable
    round_trip = EvalResult.from_dict(result.to_dict())
    assert round_trip == result


# A task whose inputs do not fit under the host memory limit we give the sandbox: the failure is
# our configuration's, whatever the solution is.
_LARGE_INPUT_TASK = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.zeros(768 * 2**20)]  # 3 GiB


def get_init_inputs():
    return []
"""


def test_plain_python_compute_at_a_published_size_is_stopped_at_its_first_read() -> None:
    """8M values read one by one into Python would run until the timeout; the audit stops the
    checked call at its first read and the verdict comes at once."""
    source = RELU_TASK.source.replace(
        '"cpu": {"batch_size": 16, "dim": 256}', '"cpu": {"batch_size": 1024, "dim": 8192}'
    )
    assert source != RELU_TASK.source
    task = task_from_source(source, "relu_published_size")
    hack = (SOLUTIONS[0].parent / "torch_fallback_runtime__python_scalars.py").read_text()
    by_index = "[max(float(x.reshape(-1)[i]), 0.0) for i in range(x.numel())]"
    hack = hack.replace("[max(float(v), 0.0) for v in x.reshape(-1)]", by_index)
    assert by_index in hack
    evaluator = Evaluator(EvalConfig(device="cpu", timeout_s=20, host_memory_bytes=4 * 2**30))
    try:
        result = evaluator.evaluate(task, hack)
    finally:
        evaluator.close()
    assert result.status is Status.INTEGRITY_VIOLATION, result.feedback
    assert result.checks_failed == ["torch_fallback_runtime"]
    assert "_local_scalar_dense" in result.error


def test_a_limit_of_ours_is_a_harness_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNELRL_CPU_BUDGET_MIB", "16384")  # let the task keep its size on CPU
    task = task_from_source(_LARGE_INPUT_TASK, "large_input")
    solution = (ROOT / "data" / "solutions" / "triton" / "01_relu.py").read_text()
    config = EvalConfig(device="cpu", timeout_s=60, host_memory_bytes=2 * 2**30)
    with Evaluator(config) as evaluator:
        result = evaluator.evaluate(task, solution)
    assert result.status is Status.HARNESS_ERROR, result.error
    assert not result.scored
    assert "not the solution's fault" in result.error
    assert "crashed" not in result.feedback.lower()


def test_a_hard_memory_ulimit_below_ours_still_evaluates(tmp_path: Path) -> None:
    """``ulimit -v`` below the sandbox's own limit: the limit is kept, not a failed setrlimit."""
    script = tmp_path / "check.py"
    script.write_text(
        "from pathlib import Path\n"
        "from kernelrl.env.evaluator import EvalConfig, Evaluator\n"
        "from kernelrl.env.task import load_task\n"
        f"root = Path({str(ROOT)!r})\n"
        "task = load_task(root / 'data/tasks/01_relu.py')\n"
        "evaluator = Evaluator(EvalConfig(device='cpu', timeout_s=60))\n"
        "result = evaluator.evaluate(task, (root / 'data/solutions/triton/01_relu.py').read_text())\n"
        "evaluator.close()\n"
        "print(result.status, result.error)\n"
    )
    limit_kib = 12 * 2**20  # 12 GiB, below the default 16 GiB sandbox limit
    done = subprocess.run(
        ["bash", "-c", f"ulimit -v {limit_kib} && {sys.executable} {script}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("correct"), done.stdout + done.stderr[-2000:]


CUDA_SOLUTIONS = sorted((Path(__file__).parents[1] / "solutions" / "cuda").glob("*.py"))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("path", CUDA_SOLUTIONS, ids=lambda p: p.stem)
def test_cuda_cpp_on_a_machine_without_a_gpu(path: Path) -> None:
    """Compiled with nvcc, never run: ``not_run`` for code that compiles (or that only this
    machine's toolkit cannot compile, e.g. ATen's CUDA headers), ``compile_error`` for code that
    is wrong."""
    config = EvalConfig(device="cpu", timeout_s=240, static_checks=False)
    with LocalPool(config, workers=1) as pool:
        (result,) = pool.evaluate([RELU_TASK.with_backend("cuda")], [path.read_text()])
    assert result.status == expected_of(path), result.error


def test_fp32_computed_in_lower_precision_is_named_in_the_feedback() -> None:
    """The CPU verdict predicts the GPU's: an fp32 matmul whose products lose precision (as
    tl.dot's default TF32 does on a GPU) is incorrect at fp32 tolerance, and the feedback says
    why and what to use instead."""
    task = load_task(ROOT / "data" / "tasks" / "18_matmul.py")
    solution = Path(__file__).parents[1] / "solutions" / "precision" / "reduced_precision_matmul.py"
    config = EvalConfig(device="cpu", timeout_s=120)
    with LocalPool(config, workers=1) as pool:
        (result,) = pool.evaluate([task], [solution.read_text()])
    assert result.status is Status.INCORRECT, result.error
    assert 'input_precision="ieee"' in result.feedback


def test_timed_calls_are_held_to_the_checked_answer(
    results_without_static_checks: dict[str, EvalResult],
) -> None:
    result = results_without_static_checks["incorrect__garbage_on_timed_calls.py"]
    assert "timed call" in result.error


def test_what_the_solution_raises_is_never_ours(
    results_without_static_checks: dict[str, EvalResult],
) -> None:
    for name in ("system_exit_in_forward", "keyboard_interrupt_in_init"):
        result = results_without_static_checks[f"runtime_error__{name}.py"]
        assert result.status is Status.RUNTIME_ERROR, result.error
    subclass = results_without_static_checks["runtime_error__tensor_subclass_output.py"]
    assert "must return torch.Tensor" in subclass.error


def test_work_left_for_a_later_call_is_held_against_the_timed_call(
    results_without_static_checks: dict[str, EvalResult],
) -> None:
    """Outputs left unwritten by timed calls and completed by later ones (untimed calls on
    repeated contents, or any next call) are compared as they were when their call ended."""
    for name in (
        "incorrect__unwritten_until_inputs_repeat.py",
        "incorrect__output_filled_in_a_later_call.py",
    ):
        result = results_without_static_checks[name]
        assert result.status is Status.INCORRECT and "timed call" in result.error, result.error


def test_failures_the_solution_causes_are_never_ours(
    results_without_static_checks: dict[str, EvalResult],
) -> None:
    """A forged report of a failure of ours is the solution's; an input the solution marked as
    requiring grad no longer breaks the harness's next refresh."""
    forged = results_without_static_checks["runtime_error__forged_harness_error.py"]
    assert forged.status is Status.RUNTIME_ERROR and "solution's" in forged.error
    marked = results_without_static_checks["correct__requires_grad_on_an_input.py"]
    assert marked.status is Status.CORRECT, marked.error


def test_every_output_comparison_is_charged_to_the_compare_phase(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The outputs kept of timed calls are compared as the checked calls' are, and the phase
    table counts their time as comparison too (it used to appear only in the total)."""
    import time

    compared: list[str] = []
    real_compare = Evaluator._compare

    def slow_compare(self, task, session, report, *args, **kwargs):
        compared.append("kept" if "input_set" in report else "checked")
        time.sleep(0.25)
        return real_compare(self, task, session, report, *args, **kwargs)

    monkeypatch.setattr(Evaluator, "_compare", slow_compare)
    good = (ROOT / "data" / "solutions" / "triton" / "01_relu.py").read_text()
    evaluator = Evaluator(EvalConfig(device="cpu", timeout_s=60, spare_children=0))
    try:
        result = evaluator.evaluate(RELU_TASK, good)
    finally:
        evaluator.close()
    assert result.status is Status.CORRECT, result.feedback
    assert "kept" in compared and "checked" in compared, compared
    assert result.phase_seconds["compare"] >= 0.25 * len(compared)


@pytest.mark.parametrize("cached", [True, False])
def test_the_measured_child_is_paused_while_its_reference_is_timed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cached: bool
) -> None:
    """A solution could leave work running as it reports its timing, to slow the reference
    timed next and so inflate its own speed-up: the worker times a reference with the measured
    child paused too (on a GPU, and once the GPU is found quiet: tests/env/test_gpu_quiet.py).
    That pause is not the child's ``paused_for_others``. A cached timing needs none; without
    the cache every evaluation times its own reference, side by side with its solution."""
    from kernelrl.env.reference import PlacementTimer, ReferenceTimingCache

    cache = ReferenceTimingCache(tmp_path / "timings.json")
    evaluator = Evaluator(
        EvalConfig(device="cpu", timeout_s=60, spare_children=0, cache_reference_timing=cached),
        timing_cache=cache,
    )
    acquired, paused_while_timed = [], []
    acquire, time_reference = evaluator.children.acquire, PlacementTimer.time

    def acquire_and_note():
        acquired.append(acquire())
        return acquired[-1]

    def time_and_note(*args):
        paused_while_timed.append(acquired[-1].paused())
        return time_reference(*args)

    monkeypatch.setattr(evaluator.children, "acquire", acquire_and_note)
    monkeypatch.setattr(PlacementTimer, "time", time_and_note)
    first, second = _good_relu_twice(evaluator)
    assert first.phase_seconds["paused_for_others"] == 0.0
    if cached:  # timed once, paused; the second evaluation's is the first one's
        assert paused_while_timed == [True]
        assert first.ref_eager == second.ref_eager
    else:
        assert paused_while_timed == [True, True]
        assert not cache.path.exists()


def test_the_reference_s_turns_are_not_the_child_s_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Uncached, the reference takes its turns between the solution's input sets while the
    child waits paused: the child's own timing phase leaves them out, as does the wall clock
    its report is checked against (``timing_unconfirmed``); the reference's is its own."""
    from kernelrl.env.reference import PlacementTimer

    evaluator = Evaluator(
        EvalConfig(device="cpu", timeout_s=60, spare_children=0, cache_reference_timing=False)
    )
    time_reference = PlacementTimer.time

    def slow_turn(*args):
        time.sleep(1.5)
        return time_reference(*args)

    monkeypatch.setattr(PlacementTimer, "time", slow_turn)
    result = _good_relu_once(evaluator)
    assert result.ref_eager is not None
    assert result.phase_seconds["reference_timing"] >= 1.5
    assert result.phase_seconds["child_timing"] < 1.5
    # Where the child's timing went, step by step, none of it the reference's turns either.
    steps = [f"child_timing_{step}" for step in ("setup", "warmup", "reps", "between")]
    assert sum(result.phase_seconds[step] for step in steps) <= result.phase_seconds["child_timing"]
    assert result.phase_seconds["child_timing_inputs"] > 0


def test_the_first_call_says_how_long_it_was_held_paused_for_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The child's ``first_call`` is wall time, so a pause for another evaluation's measurement
    while it compiles looks like compile time; the worker says how much of the first call (from
    the call sent to its report read) was such a pause."""
    evaluator = Evaluator(EvalConfig(device="cpu", timeout_s=60, spare_children=0))
    output, calls = evaluator.references.runner.output, []

    def output_during_a_pause(*args):
        calls.append(1)
        if len(calls) == 1:  # another evaluation measured meanwhile: this child is held
            other = evaluator.children.acquire()
            try:
                with evaluator.children.paused_except(other):
                    time.sleep(0.5)
            finally:
                other.close()
        return output(*args)

    monkeypatch.setattr(evaluator.references.runner, "output", output_during_a_pause)
    result = _good_relu_once(evaluator)
    paused = result.phase_seconds["first_call_paused"]
    assert 0.5 <= paused <= result.phase_seconds["paused_for_others"]


@pytest.mark.parametrize("cached", [True, False])
def test_the_reference_is_made_ready_to_time_before_the_window(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cached: bool
) -> None:
    """Building the reference's model and inputs and compiling it under torch.compile take
    seconds at KernelBench's sizes; inside the measurement's window every other sandbox would
    wait them out paused. They are made before the window (``reference_prepare``), and only
    the timing itself is in it (``reference_timing``); a cached timing needs no preparation."""
    import contextlib

    from kernelrl.env.reference import ReferenceRunner, ReferenceTimingCache

    evaluator = Evaluator(
        EvalConfig(device="cpu", timeout_s=60, spare_children=0, cache_reference_timing=cached),
        timing_cache=ReferenceTimingCache(tmp_path / "timings.json"),
    )
    window, prepared_in_window = [False], []
    device_to_itself, timers = evaluator._device_to_itself, ReferenceRunner.timers

    @contextlib.contextmanager
    def noted_window(*args, **kwargs):
        with device_to_itself(*args, **kwargs) as sharing:
            window[0] = True
            try:
                yield sharing
            finally:
                window[0] = False

    def slow_timers(*args, **kwargs):
        prepared_in_window.append(window[0])
        time.sleep(1.5)
        return timers(*args, **kwargs)

    monkeypatch.setattr(evaluator, "_device_to_itself", noted_window)
    monkeypatch.setattr(ReferenceRunner, "timers", slow_timers)
    first, second = _good_relu_twice(evaluator)
    assert first.ref_eager is not None and second.ref_eager is not None
    assert prepared_in_window == ([False] if cached else [False, False])
    assert first.phase_seconds["reference_prepare"] >= 1.5
    assert first.phase_seconds["reference_timing"] < 1.5
    assert ("reference_prepare" in second.phase_seconds) is not cached


@pytest.mark.parametrize("cached", [True, False])
def test_the_reference_s_timers_are_let_go_when_the_measurement_ends(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cached: bool
) -> None:
    """The reference's input sets are gigabytes at KernelBench's sizes: they go back when the
    window closes, before the kept outputs' references are computed, not when the evaluation
    ends."""
    import weakref

    from kernelrl.env.reference import ReferenceRunner, ReferenceTimingCache

    evaluator = Evaluator(
        EvalConfig(device="cpu", timeout_s=60, spare_children=0, cache_reference_timing=cached),
        timing_cache=ReferenceTimingCache(tmp_path / "timings.json"),
    )
    made, alive_after_window = [], []
    timers, outputs_correct = ReferenceRunner.timers, evaluator._timed_outputs_correct

    def noted_timers(*args, **kwargs):
        prepared = timers(*args, **kwargs)
        made.extend(weakref.ref(t.inputs) for t in prepared.values() if t is not None)
        return prepared

    def noted_outputs_correct(*args, **kwargs):
        alive_after_window.append(sum(ref() is not None for ref in made))
        return outputs_correct(*args, **kwargs)

    monkeypatch.setattr(ReferenceRunner, "timers", noted_timers)
    monkeypatch.setattr(evaluator, "_timed_outputs_correct", noted_outputs_correct)
    _good_relu_once(evaluator)
    assert made and alive_after_window == [0]


def _good_relu_twice(evaluator: Evaluator) -> tuple[EvalResult, EvalResult]:
    """The bundled ReLU's own solution through ``evaluator`` twice, which is closed after;
    both correct."""
    good = (ROOT / "data" / "solutions" / "triton" / "01_relu.py").read_text()
    try:
        first = evaluator.evaluate(RELU_TASK, good)
        second = evaluator.evaluate(RELU_TASK, good)
    finally:
        evaluator.close()
    assert first.status is Status.CORRECT and second.status is Status.CORRECT, first.feedback
    return first, second


def _good_relu_once(evaluator: Evaluator) -> EvalResult:
    """The bundled ReLU's own solution through ``evaluator``, which is closed after; correct."""
    good = (ROOT / "data" / "solutions" / "triton" / "01_relu.py").read_text()
    try:
        result = evaluator.evaluate(RELU_TASK, good)
    finally:
        evaluator.close()
    assert result.status is Status.CORRECT, result.feedback
    return result
