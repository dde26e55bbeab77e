"""The learning benchmark's statistics: correct@1, pass@k and paired bootstrap differences."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from learning_report import ATTEMPT_METRICS, estimate, markdown  # noqa: E402


def attempt(correct: bool, **outcome: float) -> dict[str, float]:
    row = {metric: 0.0 for metric in ATTEMPT_METRICS}
    row.update(correct=float(correct), compile=float(correct), **outcome)
    return row


def stage(correct_per_task: list[list[bool]]) -> dict[str, list[dict[str, float]]]:
    return {f"t{i}": [attempt(c) for c in flags] for i, flags in enumerate(correct_per_task)}


def test_rates_pass_at_k_and_a_paired_difference_that_excludes_zero() -> None:
    before = stage([[False] * 4 for _ in range(10)])
    # Half the tasks solved once in four, half never: correct@1 = 0.125, pass@4 = 0.5.
    after = stage([[True, False, False, False] if i % 2 else [False] * 4 for i in range(10)])
    tasks = list(before)
    table = estimate({"a": before, "b": after}, tasks, k=4, resamples=500, seed=0)
    b = table["stages"]["b"]
    assert b["correct"]["value"] == pytest.approx(0.125)
    assert b["pass@4"]["value"] == pytest.approx(0.5)
    assert b["correct"]["n"] == 40 and b["pass@4"]["tasks"] == 10
    low, high = b["correct"]["bootstrap"]
    assert 0 < low < 0.125 < high
    difference = table["differences"]["b - a"]
    assert difference["pass@4"]["excludes_zero"] and difference["correct"]["value"] > 0
    assert "| b - a |" in markdown(table, {}, {})


def test_identical_stages_differ_by_exactly_zero() -> None:
    runs = stage([[i % 3 == 0, i % 2 == 0] for i in range(12)])
    table = estimate({"a": runs, "b": runs}, list(runs), k=2, resamples=300, seed=1)
    for metric, entry in table["differences"]["b - a"].items():
        assert entry["bootstrap"] == [0.0, 0.0] and not entry["excludes_zero"], metric


def test_tasks_without_k_attempts_in_every_stage_are_left_out() -> None:
    full = stage([[True, True], [False, False]])
    partial = {"t0": full["t0"], "t1": full["t1"][:1]}
    table = estimate({"a": full, "b": partial}, ["t0", "t1"], k=2, resamples=50, seed=0)
    assert table["scored_tasks"] == ["t0"]
    with pytest.raises(ValueError, match="no task"):
        estimate({"a": full, "b": {}}, ["t0", "t1"], k=2, resamples=10, seed=0)
