"""Where an RL run's environment spent its time, from the rollouts it saved
(``save_rollouts: true``: ``RUN/rollouts/rank*.jsonl``), several runs side by side.

    python benchmarks/rollout_timings.py RUN_A RUN_B ...

An RL step waits for its evaluations; when that wait grows, this says which part of an
evaluation grew: the evaluator's phases (``phase_seconds``: waiting for a ready child, the
correctness comparison, the GPU-exclusive timing...) or the sandbox child's start-up
(``sandbox``: its CUDA context, CUPTI, the audit's first launch), which a warm child pays
before its job arrives and which bounds how fast children are ready.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any


def evaluation_results(run: Path) -> list[dict[str, Any]]:
    """Every evaluation behind a run's rollout files, once: turns answered by the run's results
    store (``env_store_path``) carry the result of the evaluation they repeat, timestamp and
    all, and took none of its time."""
    files = sorted((run / "rollouts").glob("rank*.jsonl"))
    if not files:
        raise SystemExit(f"{run}: no rollouts/rank*.jsonl (was the run saved with save_rollouts?)")
    results: dict[tuple[Any, ...], dict[str, Any]] = {}
    for file in files:
        for line in file.read_text().splitlines():
            for turn in json.loads(line).get("turns", []):
                result = turn.get("result")
                if result:
                    key = (
                        result.get("task_hash"),
                        result.get("solution_hash"),
                        result.get("timestamp"),
                    )
                    results.setdefault(key, result)
    return list(results.values())


def timing_summary(results: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Mean, median and 90th percentile of every timing an evaluation reports, and how many
    evaluations report it (the GPU phases only those that reached timing)."""
    samples: dict[str, list[float]] = defaultdict(list)
    for result in results:
        for name, value in (result.get("phase_seconds") or {}).items():
            samples[f"phase {name}"].append(float(value))
        for name, value in (result.get("sandbox") or {}).items():
            if name.endswith("_seconds") and isinstance(value, int | float):
                samples[f"child {name.removesuffix('_seconds')}"].append(float(value))
    summary = {}
    for name, values in sorted(samples.items()):
        ordered = sorted(values)
        summary[name] = {
            "mean": statistics.fmean(ordered),
            "median": statistics.median(ordered),
            "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
            "count": len(ordered),
        }
    return summary


def markdown(runs: dict[str, list[dict[str, Any]]]) -> str:
    """One row per timing, one column per run: mean / median / p90 seconds (count)."""
    summaries = {name: timing_summary(results) for name, results in runs.items()}
    names = sorted({timing for summary in summaries.values() for timing in summary})
    lines = [
        "| seconds: mean / median / p90 (evaluations) | " + " | ".join(runs) + " |",
        "| --- |" + " ---: |" * len(runs),
    ]
    for timing in names:
        cells = []
        for summary in summaries.values():
            s = summary.get(timing)
            cells.append(
                f"{s['mean']:.2f} / {s['median']:.2f} / {s['p90']:.2f} ({s['count']})" if s else "-"
            )
        lines.append(f"| {timing} | " + " | ".join(cells) + " |")
    statuses = {name: Counter(r.get("status") for r in results) for name, results in runs.items()}
    lines.append(
        "| statuses | "
        + " | ".join(", ".join(f"{k} {v}" for k, v in c.most_common()) for c in statuses.values())
        + " |"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="RL run folders (with rollouts/)")
    args = parser.parse_args()
    print(markdown({str(run): evaluation_results(run) for run in args.runs}))


if __name__ == "__main__":
    main()
