"""Where an evaluation's time goes and what its reference's timing window holds, on CPU: every
comparison charged to its phase, the measured child paused while its reference is timed, the
reference made ready before the window and let go after it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kernelrl.env.evaluator import EvalConfig, Evaluator
from kernelrl.env.result import EvalResult, Status
from kernelrl.env.task import load_task

ROOT = Path(__file__).resolve().parents[2]
RELU_TASK = load_task(ROOT / "data" / "tasks" / "01_relu.py")


def test_every_output_comparison_is_charged_to_the_compare_phase(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The outputs kept of timed calls are compared as the checked calls' are, and the phase
    table counts their time as comparison too (it used to appear only in the total)."""
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
