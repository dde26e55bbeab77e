"""The figures of a load run per phase and the requirement checks (``check``): what
``service_load.py`` prints, writes and fails on."""

from __future__ import annotations

import contextlib
import sqlite3
import statistics
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from service_load_clients import Load  # noqa: E402
from service_load_config import BAD_KINDS  # noqa: E402


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "p99": None}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50": round(pick(0.50), 3), "p95": round(pick(0.95), 3), "p99": round(pick(0.99), 3)}


def store_duplicates(store_path: Path) -> int:
    """Verdicts recorded more than once for one (task, solution, device, versions)."""
    with contextlib.closing(sqlite3.connect(store_path)) as conn:
        rows = conn.execute(
            "SELECT COUNT(*) FROM (SELECT 1 FROM results WHERE cacheable = 1 GROUP BY"
            " task_hash, backend, solution_hash, device_name, versions HAVING COUNT(*) > 1)"
        ).fetchone()
    return int(rows[0])


def store_hashes(store_path: Path) -> set[str]:
    with contextlib.closing(sqlite3.connect(store_path)) as conn:
        return {row[0] for row in conn.execute("SELECT solution_hash FROM results")}


def report(load: Load) -> dict[str, Any]:
    """Figures per phase and the requirement checks (``failures`` lists what was violated)."""
    c = load.config
    phases: dict[str, Any] = {}
    for name, (start, end) in load.phase_spans.items():
        done = [r for r in load.requests if r.phase == name and r.answered]
        span = max(end - start, 1e-9)
        phases[name] = {
            "seconds": round(span, 1),
            "answered": len(done),
            "answers_per_s": round(len(done) / span, 2),
            "fresh_evaluations_per_s": round(sum(r.fresh for r in done) / span, 2),
            "latency_all_s": percentiles([r.seconds for r in done if r.seconds is not None]),
            "latency_fresh_s": percentiles([r.seconds for r in done if r.fresh]),
            "latency_repeat_s": percentiles([r.seconds for r in done if not r.fresh]),
            "retried_requests": sum(bool(r.attempts) for r in load.requests if r.phase == name),
        }
    bad: dict[str, Any] = {}
    for kind, expected in BAD_KINDS.items():
        rows = [b for b in load.bad if b["kind"] == kind and b["code"] is not None]
        bad[kind] = {
            "sent": sum(b["kind"] == kind for b in load.bad),
            "expected": expected,
            "codes": {str(k): sum(b["code"] == k for b in rows) for k in {b["code"] for b in rows}},
            "max_s": max((b["seconds"] for b in rows), default=None),
            "statuses": sorted({str(b["status"]) for b in rows if b["code"] == 200}),
        }
    seen = store_hashes(load.service.store_path)
    gone = load.disconnects
    rss = [s["rss_mb"] for s in load.samples if s["phase"] == "long" and s.get("rss_mb")]
    memory = {}
    if len(rss) >= 4:
        # The long phase's second half against its first: flat means no growth with requests.
        half = len(rss) // 2
        for role in rss[-1]:
            first = [r[role] for r in rss[:half] if role in r]
            second = [r[role] for r in rss[half:] if role in r]
            if first and second:
                memory[role] = {"first_half_mb": round(statistics.mean(first), 1),
                                "second_half_mb": round(statistics.mean(second), 1),
                                "max_mb": max(first + second)}  # fmt: skip
    loads = [s["load_avg_1m"] for s in load.samples]
    well_formed = load.requests
    summary = {
        "config": asdict(c),
        "service_starts_s": [round(s, 1) for s in load.service.starts],
        "events": load.events,
        "phases": phases,
        "well_formed": {
            "requests": len(well_formed),
            "answered_once": sum(r.answered == 1 for r in well_formed),
            "wrong_answers": sum(r.wrong for r in well_formed),
            "fatal": [r.fatal for r in well_formed if r.fatal][:10],
            "fatal_count": sum(bool(r.fatal) for r in well_formed),
            "left_retryable": sum(not r.answered and not r.fatal and not r.wrong for r in well_formed),
            "retry_reasons": _count(a.split(":")[0] for r in well_formed for a in r.attempts),
            "worker_deaths": _cumulative(load.samples, "worker_deaths"),
            "statuses": _count(r.status for r in well_formed if r.answered),
        },
        "bad": bad,
        "disconnects": {
            "sent": len(gone),
            "evaluated_anyway": sum(d["solution_hash"] in seen for d in gone),
            "cancelled_by_pool": _cumulative(load.samples, "cancelled"),
        },
        "after_drain": load.final,
        "store_duplicates": store_duplicates(load.service.store_path),
        "route_missing_after_ready": load.route_missing_after_ready,
        "memory_long_phase": memory,
        "load_avg_1m": {"min": min(loads, default=None), "max": max(loads, default=None),
                        "mean": round(statistics.mean(loads), 2) if loads else None},
        "samples": load.samples,
    }  # fmt: skip
    summary["failures"] = check(summary)
    return summary


def _cumulative(samples: list[dict[str, Any]], key: str) -> int:
    """A counter of the service summed over its incarnations (a restart starts it again)."""
    last: dict[Any, int] = {}
    for sample in samples:
        last[sample.get("service_pid")] = max(
            last.get(sample.get("service_pid"), 0), sample[key] or 0
        )
    return sum(last.values())


def _count(values: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts


def check(summary: dict[str, Any]) -> list[str]:
    """The requirements, as counts and generous bounds (no tight timing: the box is shared)."""
    c = summary["config"]
    failures = []
    w = summary["well_formed"]
    if w["wrong_answers"]:
        failures.append(f"{w['wrong_answers']} answers were for another task or solution")
    if w["fatal"]:
        failures.append(f"well-formed requests got non-retryable errors: {w['fatal']}")
    if w["answered_once"] + w["left_retryable"] != w["requests"]:
        failures.append("a well-formed request was neither answered once nor left retryable")
    if w["left_retryable"] > max(2, w["requests"] // 100):
        failures.append(f"{w['left_retryable']} well-formed requests were never answered")
    if summary["store_duplicates"]:
        failures.append(f"{summary['store_duplicates']} verdicts are recorded twice in the store")
    # A failing reference and a hanging solution are evaluations: they wait in the same queue
    # as every fresh solution, so their bound is the slowest fresh answer plus their own limit.
    fresh = [p["latency_fresh_s"]["p99"] or 0.0 for p in summary["phases"].values()]
    queued = max(fresh, default=0.0) + c["timeout_s"] + 180
    bounds = {"slow_body": c["body_timeout_s"] + 60, "hanging_solution": queued,
              "reference_failing": queued}  # fmt: skip
    for kind, row in summary["bad"].items():
        if not row["sent"]:
            continue
        wrong = {k: n for k, n in row["codes"].items() if int(k) != row["expected"]}
        # retryable answers, not wrong ones: 503 while the service restarts, 408 when the body
        # did not reach a starved service in time, Ray Serve's 404 before its route is up
        for code in ("503", "408", "404"):
            wrong.pop(code, None)
        if wrong:
            failures.append(f"{kind}: expected {row['expected']}, got {wrong}")
        if row["max_s"] is not None and row["max_s"] > bounds.get(kind, 60):
            failures.append(f"{kind}: answered after {row['max_s']} s")
        if kind == "hanging_solution" and set(row["statuses"]) - {"timeout"}:
            failures.append(f"hanging solution answered {row['statuses']}, not timeout")
    final = summary["after_drain"] or {}
    for key in ("queued", "in_flight", "http_in_flight", "service_queued"):
        if final.get(key):
            failures.append(f"after the clients left the service still has {key}={final[key]}")
    if summary["route_missing_after_ready"]:
        failures.append(
            f"{summary['route_missing_after_ready']} requests sent after the ready banner got"
            " Ray Serve's 404: the service announced itself before its route was up"
        )
    d = summary["disconnects"]
    if d["sent"] >= 10 and d["evaluated_anyway"] >= d["sent"]:
        failures.append("no disconnected client's work was cancelled")
    return failures
