"""Environment throughput, harness overhead, time split and speedup stability on one device.

    python benchmarks/env_throughput.py --device cuda --repeats 5

Pass 1 evaluates the bundled suite once with a cold reference-timing cache (eager and
torch.compile baselines are measured then). Pass 2 evaluates every (task, bundled solution)
pair ``--repeats`` times with the cache warm: evaluations per minute, where the time of one
evaluation goes, and the spread (max/min) of each task's measured speedup over the repeats.
Sandbox on and Triton compile included in every evaluation (each child compiles afresh).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict

from kernelrl.data.bundled import bundled_pairs
from kernelrl.env.evaluator import EvalConfig
from kernelrl.env.pools import EVALS_PER_GPU
from kernelrl.env.pools.local import LocalPool
from kernelrl.env.result import EvalResult

PHASES = (
    "child_wait",
    "child_load",
    "child_first_call",
    "child_correctness",
    "reference",
    "child_timing",
    "child_profile",
    "reference_timing",
)


def run_pass(pool: LocalPool, pairs, repeats: int) -> tuple[list[EvalResult], float]:
    tasks = [t for t, _ in pairs for _ in range(repeats)]
    solutions = [s for _, s in pairs for _ in range(repeats)]
    started = time.perf_counter()
    results = pool.evaluate(tasks, solutions)
    return results, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--per-gpu", type=int, default=EVALS_PER_GPU)
    parser.add_argument(
        "--skip-cold",
        action="store_true",
        help="skip pass 1 (reference timings already cached under $KERNELRL_CACHE)",
    )
    parser.add_argument("--tasks", nargs="+", help="only these task ids (default: the suite)")
    parser.add_argument("--json-out", default="")
    args = parser.parse_args()

    pairs = [(t, s) for t, s in bundled_pairs("triton") if not args.tasks or t.id in args.tasks]
    with LocalPool(EvalConfig(device=args.device), workers=1, per_gpu=args.per_gpu) as pool:
        cold, cold_s = ([], 0.0) if args.skip_cold else run_pass(pool, pairs, 1)
        warm, warm_s = run_pass(pool, pairs, args.repeats)
    print(f"device: {warm[0].device_name}; slots: {pool.num_slots}; versions: {warm[0].versions}")
    if cold:
        print(
            f"pass 1 (cold reference cache): {len(cold)} evaluations in {cold_s:.1f} s = {len(cold) / cold_s * 60:.1f}/min"
        )
    print(
        f"pass 2 (warm cache): {len(warm)} evaluations in {warm_s:.1f} s = {len(warm) / warm_s * 60:.1f}/min"
    )
    statuses = defaultdict(int)
    for r in warm:
        statuses[str(r.status)] += 1
    print(f"statuses: {dict(statuses)}")

    totals = [r.phase_seconds["total"] for r in warm]
    timed = [r.phase_seconds.get("child_timing", 0.0) for r in warm]
    overhead = [t - w for t, w in zip(totals, timed, strict=True)]
    print(
        f"per evaluation: median total {statistics.median(totals):.2f} s, median timed work {statistics.median(timed):.2f} s, median harness overhead {statistics.median(overhead):.2f} s"
    )
    print(
        "median seconds per phase (inside one evaluation; child start and CUDA context run ahead, in the background):"
    )
    for phase in PHASES:
        values = [r.phase_seconds.get(phase, 0.0) for r in warm]
        print(f"  {phase:20s} {statistics.median(values):7.3f}")
    for key in ("import_seconds", "cuda_init_seconds", "profiler_init_seconds"):
        values = [r.sandbox.get(key) or 0.0 for r in warm]
        print(f"  child {key:14s} {statistics.median(values):7.3f} (background)")

    print("speedup vs eager over repeats (max/min):")
    by_task: dict[str, list[float]] = defaultdict(list)
    for r in warm:
        if r.speedup_vs_eager is not None:
            by_task[r.task_id].append(r.speedup_vs_eager)
    spreads = []
    for task_id, values in by_task.items():
        spread = max(values) / min(values)
        spreads.append(spread)
        print(
            f"  {task_id:28s} median {statistics.median(values):6.2f}x  spread {spread:.3f}  (n={len(values)})"
        )
    if spreads:
        print(f"speedup spread: median {statistics.median(spreads):.3f}, max {max(spreads):.3f}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            for r in cold + warm:
                f.write(json.dumps(r.to_dict()) + "\n")


if __name__ == "__main__":
    main()
