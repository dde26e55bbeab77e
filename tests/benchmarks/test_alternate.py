"""Two settings of the throughput benchmark alternated: the runs' order, the table that sets them
side by side (a failed run named, not dropped), bad options refused in one line, and a real
alternation of two CPU runs."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import alternate  # noqa: E402


def summary(rate: float, spreads: dict[str, float]) -> dict:
    return {"warm": {"evals_per_min": rate, "statuses": {"correct": 6}, "spreads": spreads}}


def test_the_settings_run_in_turn() -> None:
    assert alternate.run_order(2) == ["a1", "b1", "a2", "b2"]


def test_the_table_sets_each_run_beside_the_others_and_each_b_against_its_a() -> None:
    table = alternate.side_by_side(
        {
            "a1": summary(100.0, {"conv": 1.050, "matmul": 1.010}),
            "b1": summary(95.0, {"conv": 1.012, "matmul": 1.008}),
            "a2": summary(110.0, {"conv": 1.041}),
            "b2": {"failed": "stopped after 130 s"},
        }
    ).splitlines()
    assert table[0] == "| run | evaluations/min | verdicts | `conv` spread | `matmul` spread |"
    assert table[2] == "| a1 | 100.0 | 6 correct | 1.050 | 1.010 |"
    assert table[3] == "| b1 | 95.0 | 6 correct | 1.012 | 1.008 |"
    assert table[4] == "| a2 | 110.0 | 6 correct | 1.041 | - |"
    assert table[5].startswith("| b2 | stopped after 130 s |")
    assert table[7:] == [
        "pair 1: B's rate / A's 0.950",
        "pair 2: no ratio, a run of it failed or evaluated nothing",
    ]


def test_the_table_says_where_each_run_with_the_move_moved_the_local_memory() -> None:
    """Read off the table, as the move's rule asks: in which tasks' evaluations each run with
    the move on moved its local memory, a run that moved none saying so; a run without the
    move says nothing of it."""
    a1, b1, b2 = (summary(100.0, {"conv": 1.01}) for _ in range(3))
    a1 |= {"options": {"move_local_memory": False}}
    b1 |= {"options": {"move_local_memory": True}}
    b2 |= {"options": {"move_local_memory": True}}
    for run, moved in ((a1, {}), (b1, {"conv3x3": 5, "conv1d": 2}), (b2, {})):
        run["warm"]["local_memory_moved"] = moved
    table = alternate.side_by_side({"a1": a1, "b1": b1, "b2": b2}).splitlines()
    assert table[-2:] == [
        "b1: local memory moved in `conv1d` 2, `conv3x3` 5",
        "b2: local memory moved in no evaluation",
    ]


def test_the_table_says_how_long_each_run_s_evaluations_waited_for_gpu_memory() -> None:
    a1, b1, a2 = (summary(100.0, {"conv": 1.01}) for _ in range(3))
    a1["warm"]["admission_s"] = {"sum": 53.25, "longest": 29.9}
    b1["warm"]["admission_s"] = {"sum": 0.0, "longest": 0.0}
    table = alternate.side_by_side({"a1": a1, "b1": b1, "a2": a2}).splitlines()
    assert table[-2:] == [
        "a1: waited for GPU memory 53.2 s in all (longest 29.9 s)",
        "b1: waited for GPU memory 0.0 s in all (longest 0.0 s)",
    ]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--b=--stale-inputs", "--device", "cpu"], "after '--'"),
        (["--pairs", "0", "--b=--stale-inputs", "--", "--device", "cpu"], "at least 1"),
        (["--a=--stale-inputs", "--b=--stale-inputs", "--"], "the same setting"),
    ],
)
def test_bad_options_are_refused_in_one_line(argv, said, capsys) -> None:
    with pytest.raises(SystemExit) as raised:
        alternate.main(argv)
    # argparse prints its usage and then the one line; a message of our own is the exit's
    printed = capsys.readouterr().err.strip().splitlines()
    line = printed[-1] if printed else str(raised.value)
    assert said in line and "\n" not in line


def test_two_cpu_runs_alternated_leave_their_logs_summaries_and_table(tmp_path) -> None:
    shared = ["--device", "cpu", "--new-kernels", "--repeats", "1", "--tasks", "01_relu"]
    alternate.main(["--pairs", "1", "--b=--stale-inputs", "--out", str(tmp_path), "--", *shared])
    for name in ("a1.log", "a1.json", "a1.jsonl.gz", "b1.jsonl.gz", "side_by_side.md"):
        assert (tmp_path / name).exists(), name
    assert not (tmp_path / "a1.jsonl").exists()
    with gzip.open(tmp_path / "b1.jsonl.gz", "rt") as records:
        assert [json.loads(line)["task_id"] for line in records] == ["01_relu", "01_relu"]
    assert "--stale-inputs" in (tmp_path / "b1.log").read_text().splitlines()[0]
    assert "--stale-inputs" not in (tmp_path / "a1.log").read_text().splitlines()[0]
    table = (tmp_path / "side_by_side.md").read_text().splitlines()
    assert table[2].startswith("| a1 |") and table[3].startswith("| b1 |")
    assert "1 correct" in table[2] and "1 correct" in table[3]
    assert any(line.startswith("pair 1: B's rate / A's ") for line in table[4:])


def test_the_harness_results_read_as_the_throughput_benchmarks_summary(tmp_path) -> None:
    from kernelbench_entries import Entry, Row
    from kernelbench_harness import write_results

    entries = [
        Entry("19_ReLU", "level1/19_ReLU.py", tmp_path / "a.py", ""),
        Entry("23_Softmax", "level1/23_Softmax.py", tmp_path / "b.py", ""),
    ]
    rows = {
        "19_ReLU": Row(
            kernelrl=[
                {
                    "status": "correct",
                    "speedup_vs_eager": 1.00,
                    "phase_seconds": {"admission": 2.5},
                },
                {
                    "status": "correct",
                    "speedup_vs_eager": 1.04,
                    "phase_seconds": {"admission": 0.5},
                },
            ]
        ),
        "23_Softmax": Row(kernelrl=[{"status": "skipped (time budget)"}]),
    }
    write_results(tmp_path, entries, rows, {"kernelrl evals/min (pool warm)": "12.5"}, {})
    summary = alternate.harness_summary(json.loads((tmp_path / "results.json").read_text()))
    assert summary == {
        "warm": {
            "evals_per_min": 12.5,
            "statuses": {"correct": 2, "skipped (time budget)": 1},
            "spreads": {"19_ReLU": pytest.approx(1.04)},
            "admission_s": {"sum": 3.0, "longest": 2.5},
        }
    }
