"""The quiet-wait log of a harness run: every ``QuietProbe.wait`` appends what its probes
found, and the summary adds them up, a timeout counting its whole timeout."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import quiet_waits  # noqa: E402


def _record(quiet_after_s: float | None, **counts: int) -> str:
    record = {"timeout_s": 2.0, "quiet_after_s": quiet_after_s}
    record.update({name: counts.get(name, 0) for name in quiet_waits.COUNTS})
    return json.dumps(record)


def test_the_summary_adds_the_waits_and_counts_a_timeout_whole(tmp_path: Path) -> None:
    log = tmp_path / "waits.jsonl"
    log.write_text(
        _record(0.25, probes=12, late_launches=2)
        + "\n"
        + _record(None, probes=900, slow_reads=900, queued_late=3)
        + "\n"
    )
    assert quiet_waits.summarize(log) == {
        "waits": 2,
        "timeouts": 1,
        "wait_s": 2.25,
        "probes": 912,
        "held_off_cpu": 0,
        "late_launches": 2,
        "queued_late": 3,
        "slow_reads": 900,
    }


def test_summarizing_a_missing_log_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        quiet_waits.main(["--summarize", str(tmp_path / "none.jsonl")])


@pytest.mark.gpu
def test_a_real_wait_is_logged(tmp_path: Path) -> None:
    from kernelrl.env.gpu_quiet import QuietProbe

    log = tmp_path / "waits.jsonl"
    wait = QuietProbe.wait
    try:
        quiet_waits.log_every_wait(log)
        QuietProbe(torch.device("cuda")).wait(1.0)
    finally:
        QuietProbe.wait = wait
    summary = quiet_waits.summarize(log)
    assert summary["waits"] == 1 and summary["probes"] >= 8, summary
