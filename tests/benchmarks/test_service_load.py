"""The environment service under load, at a small scale: benchmarks/service_load.py's own code
(the real `kernelrl env serve`, its Ray workers and HTTP endpoint on loopback) with 64
concurrent clients, the fast kinds of bad requests, disconnecting clients and a worker killed
mid-run. The service restart, the hanging solution and the long run for memory are the
benchmark's (each costs minutes); benchmarks/README.md has their figures.

Asserts counts and generous bounds only: every well-formed request answered once for its own
task and solution (or left with a retryable error), nothing recorded twice in the store, each
bad request refused with its 4xx, disconnected clients' work cancelled, nothing left in flight.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("ray.serve")
pytest.importorskip("psutil")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import service_load  # noqa: E402


def test_service_under_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    config = service_load.LoadConfig(
        clients=64,
        phase_s=4.0,
        long_s=0.0,
        tasks=2,
        fresh_fraction=0.03,
        workers=1,
        per_gpu=2,
        disconnect_clients=4,
        bad_kinds="malformed_json,wrong_schema,oversized,slow_body,task_not_loading",
        body_timeout_s=3.0,
        bad_interval_s=0.5,
        kill_worker=True,
        restart_service=False,
        drain_s=120.0,
        request_timeout_s=300.0,
        out=str(tmp_path / "load"),
    )
    summary = service_load.run_load(config)
    assert summary["failures"] == [], summary["failures"]

    well_formed = summary["well_formed"]
    assert well_formed["requests"] >= 64 and well_formed["wrong_answers"] == 0
    assert well_formed["answered_once"] + well_formed["left_retryable"] == well_formed["requests"]
    assert summary["store_duplicates"] == 0
    for kind, expected in (("malformed_json", 400), ("wrong_schema", 400), ("oversized", 413),
                           ("slow_body", 408), ("task_not_loading", 422)):  # fmt: skip
        row = summary["bad"][kind]
        assert row["sent"] >= 1 and row["codes"].get(str(expected), 0) >= 1, (kind, row)
    assert summary["disconnects"]["sent"] >= 1
    final = summary["after_drain"]
    assert final["queued"] == 0 and final["in_flight"] == 0 and final["http_in_flight"] == 0
    assert final["worker_deaths"] >= 1  # the kill happened and the pool went on
    # every disconnect was cancelled or evaluated (then stored, for the next asker): none hangs
    outcome = (summary["disconnects"], final["http_answered"])
    assert final["cancelled"] + summary["disconnects"]["evaluated_anyway"] >= 1, outcome
    phases = summary["phases"]
    assert set(phases) == {"clean", "abuse", "faults"}
    assert phases["clean"]["latency_all_s"]["p50"] is not None
