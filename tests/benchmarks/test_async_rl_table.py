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
    sync = async_rl.read_run(KEPT / "runs" / "sync", KEPT / "sync.log")
    staleness_1 = async_rl.read_run(KEPT / "runs" / "async_s1", KEPT / "async_s1.log")
    assert (sync["train_runtime_s"], staleness_1["train_runtime_s"]) == (165, 126)
    assert round(staleness_1["steps_per_hour"] / sync["steps_per_hour"], 2) == 1.31
    assert sync["steps_per_hour_after_first"] is None  # these runs predate step_seconds
    table = async_rl.summary({"sync": sync, "async_s1": staleness_1})
    assert "| async_s1 | 5 | 142.9 | 1.31 | - | - | 0.695 +- 0.110 | +0.1 |" in table


def test_the_rate_after_the_first_step_comes_from_the_recorded_step_times(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "async_s1"
    shutil.copytree(KEPT / "runs" / "async_s1", run)
    summary = json.loads((run / "train_summary.json").read_text())
    summary["step_seconds"] = [60.0, 20.0, 20.0, 25.0, 25.0]  # a first step with nothing to overlap
    (run / "train_summary.json").write_text(json.dumps(summary))
    result = async_rl.read_run(run, KEPT / "async_s1.log")
    assert result["steps_per_hour_after_first"] == 4 / 90 * 3600
    assert result["steps_per_hour"] == 5 / 126 * 3600  # the whole run's rate is unchanged
