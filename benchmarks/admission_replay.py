"""What the GPU memory admission's rule does to a published-size run, replayed on the CPU from a
recorded ``kernelbench_harness.py`` run (its ``results.json``).

The run's evaluations are replayed on its slots in the order its pool took them (both repeats
submitted at once, each longest-first by ``CostModel`` before any cost was known, as
``run_kernelrl_phase`` submits them). Each asks the real ``GpuMemoryBudget`` for its task's
plan (``memory_plan``, measured here on the meta device with the evaluator's timing flags
given beside this script's own, as the harness takes them) and holds it for what it was
recorded to last past its wait for memory. Each recorded second lasts ``--scale`` seconds. The
replay under the run's own rule beside its recorded first repeat is the measure of how far a
replay can be trusted; what it cannot show is that an evaluation's time depends on what runs
beside it (a rule that runs more at once slows each of them down), so a replay points to a
rule's gain; it does not measure it.

    python benchmarks/admission_replay.py RUN/results.json --kernelbench KB/KernelBench \\
        --capacity-gib 67.26
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernelbench_entries import Entry, solution_entries  # noqa: E402
from kernelbench_harness import parse_args as harness_args  # noqa: E402

if TYPE_CHECKING:
    from kernelrl.env.task import Task
    from kernelrl.env.timing import TimingConfig

GIB = 2**30
RULES = {"first-fit": (False, False), "in order": (True, False), "backfill": (True, True)}


@dataclass
class Evaluation:
    stem: str
    repeat: int
    need_bytes: int
    hold_s: float  # recorded: from its admission to its end


@dataclass
class Replayed:
    first_repeat_s: float
    wall_s: float
    # Each evaluation's wait for memory and its end, in recorded seconds, in ``found``'s order.
    waits_s: list[float]
    ends_s: list[float]


def tasks_of(entries: Sequence[Entry]) -> list[Task]:
    from kernelrl.env.task import task_from_source

    return [task_from_source(e.task_src, e.key, "triton", e.level) for e in entries]


def pool_order(tasks: Sequence[Task], solutions: Sequence[str]) -> list[int]:
    """Task indices in the order a pool with no observed costs takes a batch of them."""
    from kernelrl.env.pools.scheduler import CostModel

    return [i for i, _ in CostModel().longest_first(tasks, solutions)]


def plan_bytes(tasks: Sequence[Task], timing: TimingConfig) -> list[int]:
    from kernelrl.env.admission import memory_plan

    return [memory_plan(task, timing).total_bytes for task in tasks]


def evaluations(rows: dict, order: Sequence[str], plans: dict[str, int]) -> list[Evaluation]:
    """Every recorded evaluation, repeat by repeat, each repeat in ``order`` (task stems)."""
    repeats = max((len(row.get("kernelrl", [])) for row in rows.values()), default=0)
    found = []
    for repeat in range(repeats):
        for stem in order:
            runs = rows[stem].get("kernelrl", [])
            if repeat < len(runs) and "phase_seconds" in runs[repeat]:
                phases = runs[repeat]["phase_seconds"]
                hold = phases["total"] - phases.get("admission", 0.0)
                found.append(Evaluation(stem, repeat, plans[stem], hold))
    return found


def replay(
    found: Sequence[Evaluation], slots: int, capacity_bytes: int, rule: str, scale: float
) -> Replayed:
    """``found`` taken in order by ``slots`` threads, each admitted by a budget under ``rule``."""
    from kernelrl.env.admission import GpuMemoryBudget

    in_order, backfill = RULES[rule]
    budget = GpuMemoryBudget(capacity_bytes, in_order=in_order, backfill=backfill)
    taken = iter(range(len(found)))
    lock = threading.Lock()
    waits, ends = [0.0] * len(found), [0.0] * len(found)
    started = time.perf_counter()

    def slot() -> None:
        while True:
            with lock:
                index = next(taken, None)
            if index is None:
                return
            asked = time.perf_counter()
            release = budget.acquire(found[index].need_bytes)
            waits[index] = (time.perf_counter() - asked) / scale
            time.sleep(found[index].hold_s * scale)
            release()
            ends[index] = (time.perf_counter() - started) / scale

    threads = [threading.Thread(target=slot) for _ in range(slots)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    first = [end for end, ev in zip(ends, found, strict=True) if ev.repeat == 0]
    return Replayed(max(first, default=0.0), max(ends, default=0.0), waits, ends)


def report(results: dict, found: Sequence[Evaluation], replays: dict[str, Replayed]) -> str:
    """A markdown table: what was recorded, then each rule's replay."""
    totals = results["totals"]
    firsts = [ev.repeat == 0 for ev in found]
    n_first = sum(firsts)
    recorded = [r.get("phase_seconds", {}).get("admission", 0.0) for row in results["rows"].values()
                for r in row.get("kernelrl", [])[:1]]  # fmt: skip
    lines = [
        f"{len(found)} evaluations ({n_first} in the first repeat); the run's options: "
        f"{totals.get('kernelrl options', '-')}",
        "",
        "| | first repeat /min | both repeats /min | first repeat's waits for memory: sum, longest |",
        "| --- | ---: | ---: | ---: |",
        f"| recorded | {totals.get('kernelrl evals/min (first repeat)', '-')} | "
        f"{totals.get('kernelrl evals/min (pool warm)', '-')} | "
        f"{sum(recorded):.1f} s, {max(recorded, default=0.0):.1f} s |",
    ]
    for rule, run in replays.items():
        waits = [w for w, first in zip(run.waits_s, firsts, strict=True) if first]
        lines.append(
            f"| replayed, {rule} | {60 * n_first / run.first_repeat_s:.1f} | "
            f"{60 * len(found) / run.wall_s:.1f} | {sum(waits):.1f} s, {max(waits):.1f} s |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="a harness run's results.json")
    parser.add_argument("--kernelbench", required=True, help="KernelBench task root (level1/ ...)")
    parser.add_argument("--capacity-gib", type=float, required=True,
                        help="the budget's capacity on the run's GPU (GiB)")  # fmt: skip
    parser.add_argument("--slots", type=int, default=4, help="the run's --per-gpu")
    parser.add_argument("--scale", type=float, default=0.1, help="replayed seconds per recorded")
    args, timing_flags = parser.parse_known_args(argv)
    harness = harness_args(["--kernelbench", args.kernelbench, *timing_flags])
    if not args.results.is_file():
        parser.error(f"{args.results}: no such file (a harness run's results.json)")
    results = json.loads(args.results.read_text())
    moved = f"move_local_memory={harness.timing.move_local_memory}"
    if moved not in results["totals"].get("kernelrl options", moved):
        parser.error(f"the run's options are not {moved}: give its timing flags, as it ran")
    recorded = {stem for stem, row in results["rows"].items()
                if any("phase_seconds" in run for run in row.get("kernelrl", []))}  # fmt: skip
    if not recorded:
        parser.error(f"{args.results}: no kernelrl evaluation is recorded in it")
    try:
        entries = solution_entries(Path(harness.solutions), Path(args.kernelbench), recorded)
    except FileNotFoundError as missing:
        parser.error(f"{args.kernelbench} is not the KernelBench task root the run used: {missing}")
    tasks = tasks_of(entries)  # loaded once: the pool's order and the plans both read them
    order = [entries[i].stem for i in pool_order(tasks, [e.solution_src for e in entries])]
    plans = dict(zip((e.stem for e in entries), plan_bytes(tasks, harness.timing), strict=True))
    found = evaluations(results["rows"], order, plans)
    capacity = int(args.capacity_gib * GIB)
    replays = {rule: replay(found, args.slots, capacity, rule, args.scale) for rule in RULES}
    print(report(results, found, replays))


if __name__ == "__main__":
    main()
