"""Environment throughput, where an evaluation's time goes, and speedup stability on one device.

    python benchmarks/env_throughput.py --device cuda --repeats 5 --new-kernels

Pass 1 evaluates the bundled suite once with a cold reference-timing cache (eager and
torch.compile baselines are measured then, and cached as in training). Pass 2 evaluates every
(task, bundled solution) pair ``--repeats`` times with the cache warm: evaluations per minute,
where the time of one evaluation goes (phases inside it, a child's start in the background, the
GPU-exclusive measurement), the host's CPU use, and the spread (max/min) of each task's measured
speedup over the repeats. Sandbox on and Triton compile included in every evaluation (each
child compiles afresh into its own empty cache). With ``--new-kernels`` every evaluation gets a
distinct source (a comment naming the rollout inside each ``@triton.jit`` function, which is in
Triton's cache key), as in training where no two rollouts are the same text.

``--pool ray`` runs the same passes through ``RayPool`` (one evaluation actor per GPU of a local
Ray, ``--workers`` GPUs), sized as ``LocalPool`` sizes itself on this host: what a training job's
environment does, to check the cluster model's per-GPU rate (``cluster_sizing.py``).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import resource
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import torch

from kernelrl.data.bundled import bundled_pairs
from kernelrl.env.evaluator import EvalConfig
from kernelrl.env.pools.base import Pool
from kernelrl.env.pools.local import LocalPool
from kernelrl.env.pools.sizing import AUTO, HostResources, Sizing, size_gpu_pool
from kernelrl.env.result import EvalResult
from kernelrl.env.sandbox.spawn import SPAWN_ENV

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster_sizing import steady_rate  # noqa: E402
from evaluator_options import add_evaluator_args, timing_from_args  # noqa: E402
from machine import describe, resolve_gpus  # noqa: E402
from speedup_spreads import (  # noqa: E402
    report_clocks,
    report_spread_evaluations,
    report_spreads,
)

if TYPE_CHECKING:
    from kernelrl.env.pools.ray import RayPool

# (phase key, where it runs, what it is) in the order of an evaluation.
PHASES = (
    ("child_wait", "slot", "waiting for a ready child"),
    ("child_load", "child", "load the solution"),
    ("child_first_call", "child", "first call: Triton compile and first run"),
    ("child_compile_ahead", "child", "of the first call: waiting for the compile companion"),
    ("child_launchers", "child", "of the first call: Triton's launchers, found or built"),
    ("first_call_paused", "worker", "of the first call, held paused while others were measured"),
    ("child_correctness", "child", "correctness on 3 input sets (first call included)"),
    ("paused_for_others", "child", "held paused while others were measured (in the rows above)"),
    ("reference", "worker", "reference outputs (overlaps the child)"),
    ("compare", "worker", "output comparison"),
    ("reference_prepare", "worker", "reference made ready to time (model, inputs, compile)"),
    ("trusted_gpu_wait", "worker", "waiting for the GPU lock (references, preparation, compares)"),
    ("trusted_gpu_held", "worker", "holding it for that work (rows above)"),
    ("gpu_wait", "worker", "queued behind other measurements"),
    ("gpu_pause", "worker", "pausing the other children"),
    ("gpu_quiet", "worker", "until the GPU runs no child's work (probe)"),
    ("child_timing_inputs", "child", "timing's input sets made, one per placement"),
    ("child_timing", "child", "timing (CUDA events, L2 flush, placements)"),
    ("child_timing_setup", "child", "of timing: first calls and the estimate of one"),
    ("child_timing_warmup", "child", "of timing: warm-up"),
    ("child_timing_reps", "child", "of timing: timed repetitions, batch by batch"),
    ("child_timing_hold", "child", "of those: GPU holds queued before each call"),
    ("child_timing_between", "child", "of timing: spot audits between batches"),
    ("child_timing_host_call", "child", "host time of one call with its new contents"),
    ("child_profile", "child", "CUPTI profile"),
    ("reference_timing", "worker", "reference timing (eager and compiled), in the window"),
    ("gpu_exclusive", "GPU to itself", "whole exclusive window (pause to resume)"),
    ("total", "", "one evaluation, end to end"),
)
# What each pass's reference timing is, by --reference-timing: the first pass of a cached run
# fills the cache, its second reads it; a reference timed in every evaluation is timed alike in both.
PASS_ONE = {
    "cached": "cold reference cache",
    "each-evaluation": "reference timed in every evaluation",
}
PASS_TWO = {
    "cached": "reference timings cached",
    "each-evaluation": "reference timed in every evaluation",
}
BACKGROUND = (
    ("import_seconds", "interpreter start, isolation and imports (wall)"),
    ("import_cpu_seconds", "the same, CPU time of the child"),
    ("gate_seconds", "held at the gate (a measurement was running)"),
    ("cuda_init_seconds", "CUDA context"),
    ("profiler_init_seconds", "CUPTI / profiler start"),
    ("audit_init_seconds", "audit warm-up kernel"),
    ("ring_lock_seconds", "host output ring page-locked"),
    ("ring_map_seconds", "device output ring mapped"),
    ("cpu_seconds", "CPU time of the child when ready"),
)


def companions(results: list[EvalResult]) -> str:
    """What the compile companions did (``--compile-ahead``), as the children report it."""
    records = [r.sandbox.get("compile_ahead", {}) for r in results]
    handed = sum(record.get("companion") == "handed to the child" for record in records)
    kernels = Counter()
    for record in records:
        kernels.update({key: record.get(key, 0) for key in ("found", "compiled_here")})
    errors = Counter(error for record in records for error in record.get("errors", []))
    said = "".join(f"\n  {count} x {error}" for error, count in errors.most_common(3))
    return (
        f"compile companions: {handed} of {len(records)} handed to their child; kernels found "
        f"compiled by one {kernels['found']}, compiled in the child {kernels['compiled_here']}"
        + said
    )


def distinct_source(source: str, label: str) -> str:
    """``source`` with ``# <label>`` as the first line of every ``@triton.jit`` function's
    body: the same kernel, a different text (Triton hashes the function's source)."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    firsts = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any(
            "jit" in ast.unparse(d) or "autotune" in ast.unparse(d) for d in node.decorator_list
        ):
            first = node.body[0]
            firsts.append((first.lineno - 1, first.col_offset))
    for index, col in sorted(firsts, reverse=True):
        lines.insert(index, " " * col + f"# {label}\n")
    return "".join(lines)


class Busy(NamedTuple):
    """Mean cores busy during a pass: the whole host's, and this process's own (the pool's
    trusted side: its slots' threads share one interpreter)."""

    host: float
    trusted: float


def trusted_cpu_seconds() -> float:
    """CPU seconds of this process so far, its children left out."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_busy_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole host so far, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [float(x) for x in f.readline().split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return (sum(fields) - idle) / tick, sum(fields) / tick


def run_pass(
    pool: Pool, pairs: Sequence, repeats: int, new_kernels: bool, tag: str, order: str = "pool"
) -> tuple[list[EvalResult], float, Busy]:
    """Results, wall seconds and the cores busy during the pass. ``order``:
    "pool", one batch the pool orders (longest-first); "rounds", each repeat of the suite a batch
    of its own, which the pool orders, so that one task's evaluations are not all started
    together; "submission", each evaluation a batch of its own, so that the pool takes them as
    submitted (batches are served in order)."""
    tasks, solutions = [], []
    for r in range(repeats):  # repeat r of every task before repeat r + 1
        for task, solution in pairs:
            tasks.append(task)
            label = f"{tag} rollout {r}: a new kernel text"
            solutions.append(distinct_source(solution, label) if new_kernels else solution)
    if new_kernels:
        assert len(set(solutions)) == len(solutions)
    busy0, trusted0 = cpu_busy_seconds()[0], trusted_cpu_seconds()
    started = time.perf_counter()
    if order == "pool":
        results = pool.evaluate(tasks, solutions)
    else:
        size = len(pairs) if order == "rounds" else 1
        futures = []
        for start in range(0, len(tasks), size):
            futures += pool.submit(tasks[start : start + size], solutions[start : start + size])
        results = [future.result() for future in futures]
    wall = time.perf_counter() - started
    busy1, trusted1 = cpu_busy_seconds()[0], trusted_cpu_seconds()
    return results, wall, Busy((busy1 - busy0) / wall, (trusted1 - trusted0) / wall)


def admission_waits(waits: list[float], noticeable_s: float = 0.01) -> str:
    """How long evaluations waited for their GPU memory plans: what the admission's order
    (``--admission-in-order``) can change at all."""
    waited = [w for w in waits if w >= noticeable_s]
    return (
        f"waited for GPU memory: {len(waited)} of {len(waits)} evaluations, "
        f"{sum(waits):.1f} s in all (longest {max(waits, default=0.0):.1f} s)"
    )


def median_of(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def open_pool(
    args: argparse.Namespace, config: EvalConfig
) -> tuple[LocalPool | RayPool, Sizing | None]:
    """The pool and how it was sized (None: CPU slots)."""
    if args.pool == "local":
        pool = LocalPool(config, workers=args.workers, per_gpu=args.per_gpu, spares=args.spares)
        return pool, pool.sizing
    from kernelrl.env.pools.ray import RayPool

    # LocalPool's own sizing for this host, so the two pools are compared like for like.
    memory = torch.cuda.get_device_properties(0).total_memory if args.device == "cuda" else 0
    sizing = size_gpu_pool(HostResources.detect(args.workers, memory), args.per_gpu)
    config.spare_children = sizing.spares if args.spares is None else args.spares
    return RayPool(config, workers=args.workers, per_gpu=sizing.per_gpu), sizing


def steady_per_min(results: Sequence[EvalResult]) -> float | None:
    """The pass's rate between a tenth and eight tenths of its completions, the pool full and
    before the tail of its last evaluations (``cluster_sizing.steady_rate``, which sizes
    clusters from it); None for fewer than ten. A whole pass's rate counts both ends."""
    if len(results) < 10:
        return None
    done = sorted(r.timestamp + r.phase_seconds.get("total", 0.0) for r in results)
    return steady_rate(done) * 60


def report(results: list[EvalResult], wall: float, busy: Busy, pool: Pool) -> dict:
    """Prints the pass's figures and returns them."""
    n = len(results)
    rate = n / wall * 60
    statuses: dict[str, int] = defaultdict(int)
    for r in results:
        statuses[str(r.status)] += 1
    print(f"{n} evaluations in {wall:.1f} s = {rate:.1f}/min; statuses {dict(statuses)}")
    steady = steady_per_min(results)
    if steady is not None:
        print(f"steady: {steady:.1f}/min between a tenth and eight tenths of its completions")
    cores = len(os.sched_getaffinity(0))
    local = isinstance(pool, LocalPool)  # its trusted side is this process; RayPool's, its actors
    trusted = (
        f"; the trusted process {busy.trusted:.2f} cores ({busy.trusted * wall / n:.2f} CPU s "
        "per evaluation)"
        if local
        else ""
    )
    print(
        f"host CPU: {busy.host:.1f} of {cores} cores busy on average "
        f"({busy.host * wall / n:.2f} CPU s per evaluation){trusted}"
    )
    exclusive = sum(r.phase_seconds.get("gpu_exclusive", 0.0) for r in results)
    print(f"GPU held exclusively for measurements: {exclusive / wall:.1%} of the wall time")
    rings = Counter(str(r.sandbox.get("output_ring")) for r in results)
    print(f"output rings: {dict(rings)}")
    # --move-local-memory: the evaluations whose first call needed local memory, by task.
    moved = Counter(r.task_id for r in results if r.phase_seconds.get("child_local_memory_move"))
    if moved:
        print(f"local memory moved in {moved.total()} evaluations: {dict(sorted(moved.items()))}")
    waits = [r.phase_seconds.get("admission", 0.0) for r in results]
    print(admission_waits(waits))
    if any("compile_ahead" in r.sandbox for r in results):
        print(companions(results))
    print("| phase | where | what | median s |")
    print("| --- | --- | --- | ---: |")
    phases = {}
    for key, where, what in PHASES:
        value = median_of([r.phase_seconds.get(key, 0.0) for r in results])
        phases[key] = value
        print(f"| `{key}` | {where} | {what} | {value:.3f} |")
    for key, what in BACKGROUND:
        value = median_of([float(r.sandbox.get(key) or 0.0) for r in results])
        phases[f"child_{key}"] = value
        print(f"| `{key}` | spare child, ahead of time | {what} | {value:.3f} |")
    return {
        "evaluations": n,
        "wall_s": wall,
        "evals_per_min": rate,
        "steady_evals_per_min": steady,
        "statuses": dict(statuses),
        "busy_cores": busy.host,
        "trusted_cores": busy.trusted if local else None,
        "host_cores": cores,
        "cpu_s_per_eval": busy.host * wall / n if n else None,
        "gpu_exclusive_share": exclusive / wall,
        "local_memory_moved": dict(moved),
        "admission_s": {"sum": sum(waits), "longest": max(waits, default=0.0)},
        "phase_medians": phases,
        **report_spreads(results),
        "spread_evaluations": report_spread_evaluations(results),
        "gpu_clocks": report_clocks(results),
        "slots": pool.num_slots,
        "spares": pool.config.spare_children,
        "pool": type(pool).__name__,
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--per-gpu", type=int, default=AUTO, help="evaluations in flight per GPU (0: sized)"
    )
    parser.add_argument("--spares", type=int, default=None, help="children warming per GPU")
    parser.add_argument(
        "--workers",
        default="1",
        help="GPUs, or 'all' for every GPU of this machine (CPU: slots)",
    )
    parser.add_argument("--new-kernels", action="store_true", help="a distinct source each")
    parser.add_argument(
        "--run-importing",
        action="store_true",
        help="children still importing run during measurements (EvalConfig)",
    )
    parser.add_argument(
        "--skip-cold",
        action="store_true",
        help="skip pass 1 (reference timings already cached under $KERNELRL_CACHE)",
    )
    parser.add_argument(
        "--stale-inputs",
        action="store_true",
        help="time every call on the same input contents (TimingConfig.fresh_inputs off)",
    )
    parser.add_argument(
        "--spawn",
        choices=("fork_server", "exec"),
        default="fork_server",
        help="how sandbox children start: forked from one that imported torch, or each its own",
    )
    parser.add_argument(
        "--pool",
        choices=("local", "ray"),
        default="local",
        help="LocalPool or RayPool (one actor per GPU)",
    )
    add_evaluator_args(parser)
    parser.add_argument(
        "--reference-timing",
        choices=("cached", "each-evaluation"),
        default="cached",
        help="reuse each task's reference timing, or time it in every evaluation's own "
        "exclusive window, interleaved with the solution (EvalConfig.cache_reference_timing)",
    )
    parser.add_argument(
        "--order",
        choices=("pool", "rounds", "submission"),
        default="pool",
        help="a pass as one batch the pool orders (longest first), each repeat of the suite its "
        "own batch (one evaluation of every task a round), or each evaluation its own batch, "
        "taken in submission order",
    )
    parser.add_argument("--tasks", nargs="+", help="only these task ids (default: the suite)")
    parser.add_argument("--json-out", default="", help="every EvalResult, one JSON line each")
    parser.add_argument("--summary-out", default="", help="the figures as JSON")
    args = parser.parse_args()
    args.timing = timing_from_args(parser, args, fresh_inputs=not args.stale_inputs)
    args.workers = resolve_gpus(args.workers)
    return args


def main() -> None:
    args = parse_args()
    os.environ[SPAWN_ENV] = args.spawn
    pairs = [(t, s) for t, s in bundled_pairs("triton") if not args.tasks or t.id in args.tasks]
    config = EvalConfig(
        device=args.device,
        run_importing_during_measurement=args.run_importing,
        cache_reference_timing=args.reference_timing == "cached",
        compile_ahead=args.compile_ahead,
        admission_in_order=args.admission_in_order,
        admission_backfill=args.admission_backfill,
        timing=args.timing,
    )
    started = time.perf_counter()
    pool, sizing = open_pool(args, config)
    with pool:
        print(
            f"pool: {type(pool).__name__}, {pool.num_slots} slots, {pool.config.spare_children} "
            f"spares per device ({sizing.why if sizing else 'CPU slots'}); started in "
            f"{time.perf_counter() - started:.1f} s",
            flush=True,
        )
        cold: list[EvalResult] = []
        summary: dict = {"sizing": vars(sizing) if sizing else None, "gpus": args.workers}
        if not args.skip_cold:
            cold, cold_s, cold_busy = run_pass(pool, pairs, 1, args.new_kernels, "cold", args.order)
            print(f"pass 1 ({PASS_ONE[args.reference_timing]}):")
            summary["cold"] = report(cold, cold_s, cold_busy, pool)
        warm, warm_s, warm_busy = run_pass(
            pool, pairs, args.repeats, args.new_kernels, "warm", args.order
        )
    print(f"device: {warm[0].device_name}; versions: {warm[0].versions}")
    print(f"pass 2 ({PASS_TWO[args.reference_timing]}), {args.repeats} repeats:")
    summary["warm"] = report(warm, warm_s, warm_busy, pool)
    finish(args, summary, cold, warm)


def finish(
    args: argparse.Namespace, summary: dict, cold: list[EvalResult], warm: list[EvalResult]
) -> None:
    """The headline figure, and the results and summary files ``args`` asks for."""
    first = warm[0]
    summary["machine"] = describe()  # after the pool: this process opens no GPU while it runs
    summary["device_name"] = first.device_name
    summary["versions"] = first.versions
    summary["new_kernels"] = args.new_kernels
    summary["options"] = vars(args)  # the timing procedure, compiling ahead, the pool's sizing
    kind = "new-kernel" if args.new_kernels else "repeated-kernel"
    gpu = first.device_name.replace("NVIDIA ", "").split()[0] if args.device != "cpu" else "CPU"
    print(
        f"{kind} throughput: {summary['warm']['evals_per_min']:.1f} evaluations/min per {gpu} "
        f"({first.device_name}, {summary['warm']['host_cores']} host cores)"
    )
    if args.json_out:
        with open(args.json_out, "w") as f:
            for r in cold + warm:
                f.write(json.dumps(r.to_dict()) + "\n")
    if args.summary_out:
        with open(args.summary_out, "w") as f:
            json.dump(summary, f, indent=1, default=str)


if __name__ == "__main__":
    main()
