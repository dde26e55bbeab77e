"""Ray pool scaling: evaluations per second against the number of GPU worker actors.

    python benchmarks/ray_scaling.py --workers 1 2 4                 # CPU, logical GPUs
    python benchmarks/ray_scaling.py --workers 1 2 --device cuda     # real GPUs

For every worker count the script starts a fresh RayPool (its own local Ray instance, with as
many logical GPUs as workers on a machine without GPUs), warms it up (every selected task once
per worker, so children are warm and reference timings are in the shared results store), then
times one batch of ``--evals`` evaluations of bundled (task, solution) pairs. Per point it reports

- throughput (evaluations per second of pool wall time) and scaling efficiency
  ``throughput(N) / (N * throughput(1))``;
- the mean evaluation time inside the workers, which shows CPU contention: on a machine with
  fewer cores than evaluations in flight every evaluation gets slower, and throughput cannot
  scale past the number of cores, whatever the pool does;
- pool overhead, two ways: the per-item round trip that the pool adds beyond the evaluation
  itself (dispatch, Ray RPC, serialisation; ``phase_seconds["pool_overhead"]``) as a share of
  the evaluation time, and the idle share of slot time ``1 - sum(eval) / (wall * slots)``, which
  also counts the batch's tail, where some slots have nothing left to do.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kernelrl.data.bundled import bundled_pairs
from kernelrl.env.evaluator import EvalConfig
from kernelrl.env.pools.ray import RayPool
from kernelrl.env.result import EvalResult

DEFAULT_TASKS = "01_relu,02_gelu_tanh,05_channel_affine,06_row_sum"


def machine() -> dict[str, Any]:
    import torch

    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_cores": os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def run_point(
    workers: int,
    pairs: list[tuple[Any, str]],
    evals: int,
    per_gpu: int,
    config: EvalConfig,
    store_path: str,
) -> dict[str, Any]:
    started = time.perf_counter()
    # CPU mode declares logical GPUs, also on a machine that has real ones.
    logical = workers if config.device == "cpu" else None
    pool = RayPool(
        config, workers=workers, per_gpu=per_gpu, store_path=store_path, logical_gpus=logical
    )
    startup_s = time.perf_counter() - started
    try:
        # Every task once (reference timings into the store), and every slot busy once.
        warm = [pairs[i % len(pairs)] for i in range(max(len(pairs), workers * per_gpu))]
        warm_results = pool.evaluate([t for t, _ in warm], [s for _, s in warm])
        batch = [pairs[i % len(pairs)] for i in range(evals)]
        started = time.perf_counter()
        results: list[EvalResult] = pool.evaluate([t for t, _ in batch], [s for _, s in batch])
        wall_s = time.perf_counter() - started
    finally:
        pool.close()
    bad = [r for r in results + warm_results if not r.correct]
    if bad:
        raise SystemExit(
            f"{len(bad)} evaluations were not correct, e.g. {bad[0].task_id}: {bad[0].error[:300]}"
        )
    eval_s = [r.phase_seconds["total"] for r in results]
    overhead_s = [r.phase_seconds["pool_overhead"] for r in results]
    slots = workers * per_gpu
    return {
        "workers": workers,
        "slots": slots,
        "evals": len(results),
        "startup_s": round(startup_s, 2),
        "wall_s": round(wall_s, 3),
        "evals_per_s": len(results) / wall_s,
        "mean_eval_s": statistics.mean(eval_s),
        "sum_eval_s": sum(eval_s),
        "pool_overhead_share": sum(overhead_s) / sum(eval_s),
        "mean_pool_overhead_ms": 1e3 * statistics.mean(overhead_s),
        "idle_slot_share": 1 - sum(eval_s) / (wall_s * slots),
        "device_name": results[0].device_name,
    }


def table(points: list[dict[str, Any]]) -> str:
    base = points[0]["evals_per_s"] / points[0]["workers"]
    lines = [
        "| workers | slots | evals | wall s | evals/s | scaling eff. | mean eval s | pool overhead | idle slot time |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for p in points:
        efficiency = p["evals_per_s"] / (p["workers"] * base)
        lines.append(
            f"| {p['workers']} | {p['slots']} | {p['evals']} | {p['wall_s']:.1f} |"
            f" {p['evals_per_s']:.3f} | {efficiency:.2f} | {p['mean_eval_s']:.2f} |"
            f" {100 * p['pool_overhead_share']:.2f}% ({p['mean_pool_overhead_ms']:.0f} ms) |"
            f" {100 * p['idle_slot_share']:.1f}% |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--evals", type=int, default=16, help="timed evaluations per point")
    parser.add_argument("--per-gpu", type=int, default=1, help="evaluations in flight per worker")
    parser.add_argument("--device", choices=["cpu", "cuda", "auto"], default="cpu")
    parser.add_argument("--tasks", default=DEFAULT_TASKS, help="comma-separated bundled task ids")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json-out", default="", help="write machine and points as JSON here")
    args = parser.parse_args(argv)

    wanted = args.tasks.split(",")
    pairs = [(t, s) for t, s in bundled_pairs("triton") if t.id in wanted]
    if len(pairs) != len(wanted):
        parser.error(f"unknown task ids in {args.tasks}")
    config = EvalConfig(device=args.device, timeout_s=args.timeout)
    info = machine()
    print(json.dumps(info), flush=True)
    points = []
    with tempfile.TemporaryDirectory() as folder:
        store_path = str(Path(folder) / "results.db")  # reference timings shared by all points
        for workers in args.workers:
            point = run_point(workers, pairs, args.evals, args.per_gpu, config, store_path)
            print(json.dumps(point), flush=True)
            points.append(point)
    print(table(points))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"machine": info, "points": points}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
