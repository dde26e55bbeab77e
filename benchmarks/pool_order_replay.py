"""What the order a pool takes a batch in does to the batch's wall time, replayed from a recorded
``env_throughput.py`` run (its ``--summary-out`` JSON and ``--json-out`` records beside it).

A pass's evaluations are replayed on the run's slots, each lasting what it was recorded to last
(its ``total``): once in submission order, as the run took them, and once longest-first by the
cost model a pool holds when the pass is submitted (``CostModel`` having observed the first
pass). The submission-order replay is checked against the recorded wall: it is the measure of
how far a replay can be trusted. What a replay cannot show: an evaluation's time depends on its
neighbours (the others' measurements pause it), and it keeps what it took beside the old ones.

    python benchmarks/pool_order_replay.py benchmarks/results/throughput_h200/toolchain/bundled/default.json
"""

from __future__ import annotations

import argparse
import gzip
import heapq
import json
from collections.abc import Sequence
from pathlib import Path

from kernelrl.env.pools.scheduler import CostModel


def replay(seconds: Sequence[float], slots: int) -> float:
    """Wall time of ``seconds`` taken in order, each by the first slot free."""
    free = [0.0] * slots
    for duration in seconds:
        heapq.heappush(free, heapq.heappop(free) + duration)
    return max(free)


def recorded_wall(rows: Sequence[dict]) -> float:
    """From the first evaluation's start to the last one's end (``timestamp`` is the start)."""
    starts = [row["timestamp"] for row in rows]
    return max(
        s + row["phase_seconds"]["total"] for s, row in zip(starts, rows, strict=True)
    ) - min(starts)


def load_run(summary_path: Path) -> tuple[dict, list[dict], list[dict]]:
    """The summary, the first pass's records and the second pass's."""
    summary = json.loads(summary_path.read_text())
    records = summary_path.with_suffix(".jsonl.gz")
    with (
        gzip.open(records, "rt")
        if records.exists()
        else summary_path.with_suffix(".jsonl").open() as f
    ):
        rows = [json.loads(line) for line in f]
    first = summary["cold"]["evaluations"] if summary.get("cold") else 0
    if len(rows) != first + summary["warm"]["evaluations"]:
        raise SystemExit(f"{len(rows)} records, and the summary counts another number")
    return summary, rows[:first], rows[first:]


def compare_orders(summary_path: Path) -> dict:
    """The second pass replayed in both orders beside what was recorded."""
    summary, first, second = load_run(summary_path)
    if not first:
        raise SystemExit("no first pass: no costs a pool would have known")
    slots = summary["warm"]["slots"]
    costs = CostModel()
    for row in first:
        costs.observe(row["task_hash"], row["phase_seconds"]["total"])
    known = costs.estimate([(row["task_hash"], 0) for row in second])
    longest_first = sorted(range(len(second)), key=lambda i: -known[i])
    seconds = [row["phase_seconds"]["total"] for row in second]
    n = len(second)
    walls = {
        "recorded": recorded_wall(second),
        "replayed, submission order": replay(seconds, slots),
        "replayed, longest first": replay([seconds[i] for i in longest_first], slots),
    }
    return {"run": str(summary_path), "slots": slots, "evaluations": n, "walls": walls,
            "per_min": {k: 60 * n / v for k, v in walls.items()}}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("summaries", nargs="+", type=Path, help="env_throughput --summary-out")
    args = parser.parse_args(argv)
    print("| run | slots | evaluations | recorded | replayed, submission order | replayed, "
          "longest first | longest first / recorded |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for path in args.summaries:
        try:
            result = compare_orders(path)
        except SystemExit as skipped:
            print(f"| {path} | {skipped} |")
            continue
        rates = result["per_min"]
        cells = " | ".join(f"{w:.1f} s ({rates[k]:.1f}/min)" for k, w in result["walls"].items())
        gain = rates["replayed, longest first"] / rates["recorded"]
        print(f"| {path} | {result['slots']} | {result['evaluations']} | {cells} | {gain:.2f} |")


if __name__ == "__main__":
    main()
