"""The asynchronous-RL table is recomputed from the runs kept in the repository: the rates from
each run's console, the rewards from its summary, and the steady-state rate from the step times
a summary records (absent from runs made before it did, and then shown as absent, not as 0)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import async_rl  # noqa: E402

KEPT = ROOT / "benchmarks" / "results" / "async_rl" / "gpu_h200"


def test_the_kept_gpu_runs_give_the_published_rates() -> None:
    runs = {
        name: async_rl.read_run(KEPT / "runs" / name, KEPT / f"{name}.log")
        for name in ("sync", "async_s1", "async_s2")
    }
    assert [r["train_runtime_s"] for r in runs.values()] == [259, 140, 119]
    sync, staleness_1, staleness_2 = runs.values()
    assert round(staleness_1["steps_per_hour"] / sync["steps_per_hour"], 2) == 1.85
    assert round(staleness_2["steps_per_hour"] / sync["steps_per_hour"], 2) == 2.18
    # after step 1: 5 steps over the recorded step times of steps 2-6
    assert round(sync["steps_per_hour_after_first"], 1) == 105.0
    assert round(staleness_2["steps_per_hour_after_first"], 1) == 248.5
    table = async_rl.summary(runs)
    assert "| async_s2 | 6 | 181.5 | 2.18 | 248.5 | 2.37 | 0.748 +- 0.030 | +0.1 |" in table


def test_the_rate_after_the_first_step_comes_from_the_recorded_step_times(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "async_s1"
    shutil.copytree(KEPT / "runs" / "async_s1", run)
    summary = json.loads((run / "train_summary.json").read_text())
    summary["step_seconds"] = [60.0, 20.0, 20.0, 25.0, 25.0, 30.0]  # nothing to overlap at first
    (run / "train_summary.json").write_text(json.dumps(summary))
    result = async_rl.read_run(run, KEPT / "async_s1.log")
    assert result["steps_per_hour_after_first"] == 5 / 120 * 3600
    assert result["steps_per_hour"] == 6 / 140 * 3600  # the whole run's rate is unchanged


def test_an_arm_that_died_before_its_summary_gives_no_row() -> None:
    """The in-process call's staleness-1 arm trained its steps, then died at exit: no figure is
    drawn from its console alone."""
    kept = KEPT.parent / "gpu_h200_in_process"
    died = async_rl.read_run(kept / "runs" / "async_s1", kept / "async_s1.log")
    assert "| async_s1 | 0 | - |" in async_rl.summary({"async_s1": died})
