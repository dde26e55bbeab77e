"""The published-size harness's summary of where a set's time went, and why a correct
evaluation's timing went unused."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from kernelbench_harness import main, parse_args, phase_sums, verdict_totals  # noqa: E402
from kernelbench_kb import import_error  # noqa: E402
from kernelbench_kernelrl import kernelrl_config, result_row, timing_shared  # noqa: E402

from kernelrl.env.evaluator import EvalConfig  # noqa: E402
from kernelrl.env.gpu_claim import SHARED_WITH_KEY, SHARING_UNKNOWN_KEY  # noqa: E402
from kernelrl.env.timing import TimingConfig  # noqa: E402


def test_phase_sums_add_every_evaluation_largest_first() -> None:
    runs = {
        "19_ReLU": [{"phase_seconds": {"compare": 4.5, "admission": 1.0}}],
        "23_Softmax": [
            {"phase_seconds": {"compare": 0.5, "reference_prepare": 2.25}},
            {"status": "harness_error"},  # no phases recorded
        ],
    }
    assert list(phase_sums(runs).items()) == [
        ("compare", 5.0),
        ("reference_prepare", 2.2),
        ("admission", 1.0),
    ]


def test_an_unused_timing_says_who_shared_the_gpu_or_why_nobody_could_tell() -> None:
    assert timing_shared({}) == ""
    assert timing_shared({SHARED_WITH_KEY: [4242]}) == "shared with evaluators [4242]"
    why = "the GPU was not found quiet within 2 s of pausing the sandboxes"
    evaluation = {"status": "correct", "sandbox": {SHARING_UNKNOWN_KEY: why}}
    row = result_row(evaluation, timing_shared(evaluation["sandbox"]))
    assert row["status"] == "correct" and row["timing_shared"] == why


def test_a_kernelbench_that_does_not_import_stops_the_run_before_any_phase(
    tmp_path: Path,
) -> None:
    """KernelBench's ``eval`` imports packages a GPU machine may lack (pydantic, requests):
    the run says which at once, in one line, rather than after kernelrl's phase has run."""
    package = tmp_path / "src" / "kernelbench"
    package.mkdir(parents=True)
    (package / "utils.py").write_text("def get_gpu_vendor():\n    return 'nvidia'\n")
    (package / "eval.py").write_text("import kernelrl_test_absent_package\n")
    out = tmp_path / "out"
    argv = ["--kernelbench", str(tmp_path / "tasks"), "--kernelbench-src", str(tmp_path / "src")]
    with pytest.raises(SystemExit) as stopped:
        main([*argv, "--phases", "kernelrl,kb-inproc", "--out", str(out)])
    said = str(stopped.value)
    assert "No module named 'kernelrl_test_absent_package'" in said and "\n" not in said, said
    assert not out.exists()
    assert import_error(str(tmp_path / "src")) is not None
    (package / "eval.py").write_text("import json\n")
    assert import_error(str(tmp_path / "src")) is None


def test_tasks_a_budget_left_unevaluated_are_counted_apart_from_the_verdicts() -> None:
    """KernelBench's harness stopped by its time budget after two correct tasks: all it
    evaluated was correct, and the rest are counted as skipped, not as failures."""
    verdicts = ["correct", "correct", "skipped (time budget)", "skipped"]
    assert verdict_totals("kb-inproc", verdicts) == {
        "kb-inproc all evaluated correct": True,
        "kb-inproc skipped (time budget)": 2,
    }
    failed = verdict_totals("kernelrl", ["correct", "incorrect"])
    assert failed["kernelrl all evaluated correct"] is False
    none_evaluated = verdict_totals("kernelrl", ["skipped (time budget)"])
    assert none_evaluated["kernelrl all evaluated correct"] is False


def test_the_harness_evaluates_as_the_environment_does_unless_a_flag_says_otherwise(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The harness takes the evaluator's flags from the module the throughput benchmark uses,
    so a setting is spelt and defaulted alike in both and an alternation can name it."""
    tasks = ["--kernelbench", str(tmp_path)]
    default = kernelrl_config(parse_args(tasks))
    assert default.timing == TimingConfig()
    assert default.admission_in_order == EvalConfig.admission_in_order
    assert default.compile_ahead == EvalConfig.compile_ahead
    flags = ["--no-move-local-memory", "--enough-timed-ms", "0", "--placements", "2"]
    chosen = kernelrl_config(parse_args([*tasks, *flags, "--no-admission-in-order"]))
    assert chosen.timing == TimingConfig(move_local_memory=False, enough_timed_ms=0, placements=2)
    assert not chosen.admission_in_order
    with pytest.raises(SystemExit):
        parse_args([*tasks, "--placements", "0"])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.endswith("placements (0) must be at least 1 and at most most_placements (16)")
