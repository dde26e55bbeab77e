"""The pool-order replay: a recorded pass replayed in submission order gives back its recorded
wall, and longest-first never leaves the long evaluation for last."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import pool_order_replay  # noqa: E402

RECORDED = BENCHMARKS / "results" / "throughput_h200" / "toolchain" / "bundled" / "default.json"


def write_run(
    folder: Path, first: list[tuple[str, float]], second: list[tuple[str, float]]
) -> Path:
    """A two-slot run whose passes took each evaluation in submission order."""
    rows, clock = [], 1000.0
    for task, seconds in first:
        rows.append({"task_hash": task, "timestamp": clock, "phase_seconds": {"total": seconds}})
        clock += seconds
    free = [clock, clock]
    for task, seconds in second:
        slot = free.index(min(free))
        rows.append(
            {"task_hash": task, "timestamp": free[slot], "phase_seconds": {"total": seconds}}
        )
        free[slot] += seconds
    summary = {"cold": {"evaluations": len(first)},
               "warm": {"evaluations": len(second), "slots": 2}}  # fmt: skip
    path = folder / "run.json"
    path.write_text(json.dumps(summary))
    with gzip.open(folder / "run.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    return path


def test_the_long_evaluation_goes_first_and_the_batch_ends_sooner(tmp_path: Path) -> None:
    short, long = ("short", 1.0), ("long", 4.0)
    run = write_run(tmp_path, [short, long], [short, short, short, short, long])
    walls = pool_order_replay.compare_orders(run)["walls"]
    assert walls["recorded"] == walls["replayed, submission order"] == pytest.approx(6.0)
    assert walls["replayed, longest first"] == pytest.approx(4.0)


def test_a_run_without_a_first_pass_is_refused_with_one_line(tmp_path: Path) -> None:
    run = write_run(tmp_path, [], [("a", 1.0)])
    with pytest.raises(SystemExit, match="no first pass"):
        pool_order_replay.compare_orders(run)


def test_a_recorded_gpu_run_is_given_back_by_its_replay() -> None:
    result = pool_order_replay.compare_orders(RECORDED)
    walls = result["walls"]
    assert result["slots"] == 8 and result["evaluations"] == 62
    assert walls["replayed, submission order"] == pytest.approx(walls["recorded"], rel=0.01)
    assert walls["replayed, longest first"] < walls["recorded"]
