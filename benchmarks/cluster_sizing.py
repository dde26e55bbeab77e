"""A calibrated model of one RL step on a cluster: step time, what bounds it, and how many
environment GPUs to give it.

    python benchmarks/cluster_sizing.py --recipe recipes/qwen3-14b/trloo/drkernel_14b.yaml \
        --train-gpus 16 --gen-gpus 8 --env-gpus 1 2 4 8 16
    python benchmarks/cluster_sizing.py --validate benchmarks/results/throughput_h100/suite.jsonl.gz
    python benchmarks/cluster_sizing.py --validate-pool ONE_GPU.json TWO_GPUS.json
    python benchmarks/cluster_sizing.py --validate-pool FITTED_ON.json ANOTHER_RUN.json
    python benchmarks/cluster_sizing.py --decompose RUN.json [RUN.json ...]

Why a model: a step of Dr. Kernel's recipe makes hundreds of evaluations per turn, and whether
generation, the environment or the update sets the step time decides how a cluster is split.
The inputs are measured figures (kept as defaults below with where they come from) or, for
generation, a published vLLM figure; every assumption is a flag.

Per turn, the trajectories' completions are generated (tokens / generation throughput), then
evaluated (evaluations / environment throughput, plus one evaluation's latency for the last
one); with ``overlap_evaluation`` the evaluations of a turn run while the rest of it is still
generated, so a turn takes the larger of the two plus that latency. The update follows the
last turn. Environment throughput is per GPU, by task size: small tasks (the bundled suite)
and KernelBench-sized ones (inputs of GiBs) are measured separately.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import yaml

# Measured on one H200 host (16 cores), benchmarks/results/throughput_h200/min_reps/min10_8
# (10 timed calls a placement, the L2 flush of before: the float flush was 24% faster on an H100):
SMALL_EVALS_PER_MIN = 176.2  # bundled suite, new kernels, reference timings cached
SMALL_LATENCY_S = 2.14  # median end-to-end evaluation, same run
# Per-GPU rate of several GPUs sharing one host relative to one GPU alone there (steady state,
# RayPool, 2 H200s of one 32-core host, 16 cores each: benchmarks/results/ray_pool_gpus).
MULTI_GPU_EFFICIENCY = 0.83
# KernelBench published sizes, first repeat (16 of 16), reference timings cached as after a task's
# first evaluation, mean of two runs on one H200: results/throughput_h200/timing_options/published
LARGE_EVALS_PER_MIN = 48.2
# Published: vLLM (baseline, no tuning) serving Qwen3-14B on H100, ShareGPT, total tokens/s,
# from the GPUStack performance lab's published Qwen3-14B/H100 measurements
VLLM_TOKENS_PER_S_PER_GPU = 6595.66
H100_BF16_FLOPS = 989e12  # dense bf16 peak of an H100 SXM (NVIDIA datasheet)


@dataclass(frozen=True)
class Recipe:
    trajectories: int  # completions per generation round (one step)
    turns: int
    max_turn_tokens: int
    params: float  # policy parameters

    @classmethod
    def load(cls, path: str, train_gpus: int) -> Recipe:
        """Trajectories per step as TRL counts them: per-device batch x processes x steps per
        generation; the parameter count from the model's name (``-14B``)."""
        config = yaml.safe_load(Path(path).read_text())
        per_step = (
            int(config.get("per_device_train_batch_size", 1))
            * train_gpus
            * int(
                config.get("steps_per_generation") or config.get("gradient_accumulation_steps", 1)
            )
        )
        name = str(config.get("model_name_or_path", ""))
        digits = "".join(c for c in name.rsplit("-", 1)[-1] if c.isdigit() or c == ".")
        params = float(digits) * 1e9 if name.upper().endswith("B") and digits else 14e9
        return cls(
            per_step, int(config.get("max_turns", 1)), int(config["max_completion_length"]), params
        )


@dataclass(frozen=True)
class Cluster:
    train_gpus: int
    gen_gpus: int
    env_gpus: int
    gen_tokens_per_s_per_gpu: float = VLLM_TOKENS_PER_S_PER_GPU
    small_evals_per_min: float = SMALL_EVALS_PER_MIN
    large_evals_per_min: float = LARGE_EVALS_PER_MIN
    large_share: float = 0.0  # share of the tasks at KernelBench's sizes
    eval_latency_s: float = SMALL_LATENCY_S
    multi_gpu_efficiency: float = MULTI_GPU_EFFICIENCY  # per GPU, when several share a host
    mfu: float = 0.35  # assumed model FLOPs utilisation of the update


def env_evals_per_s(cluster: Cluster) -> float:
    """Evaluations per second of ``env_gpus``, the task mix weighted by time per evaluation."""
    per_eval_min = (1 - cluster.large_share) / cluster.small_evals_per_min + (
        cluster.large_share / cluster.large_evals_per_min
    )
    efficiency = cluster.multi_gpu_efficiency if cluster.env_gpus > 1 else 1.0
    return cluster.env_gpus * efficiency / per_eval_min / 60


def predict(
    recipe: Recipe, cluster: Cluster, mean_turn_tokens: float, train_step_s: float | None
) -> dict:
    """Seconds per stage of one step and the stage that bounds it."""
    gen_turn = (
        recipe.trajectories
        * mean_turn_tokens
        / (cluster.gen_gpus * cluster.gen_tokens_per_s_per_gpu)
    )
    env_turn = recipe.trajectories / env_evals_per_s(cluster)
    turn = max(gen_turn, env_turn) + cluster.eval_latency_s
    if train_step_s is None:  # 6 x params x tokens, prompt context grows with the turns
        tokens = recipe.trajectories * mean_turn_tokens * recipe.turns * 1.5
        train_step_s = (
            6 * recipe.params * tokens / (cluster.train_gpus * H100_BF16_FLOPS * cluster.mfu)
        )
    stages = {
        "generation": recipe.turns * gen_turn,
        "environment": recipe.turns * env_turn,
        "training": train_step_s,
    }
    return {
        "step_s": recipe.turns * turn + train_step_s,
        "generation_s": stages["generation"],
        "environment_s": stages["environment"],
        "training_s": train_step_s,
        "bound": max(stages, key=stages.get),
        "evaluations_per_step": recipe.trajectories * recipe.turns,
    }


def recommend_env_gpus(recipe: Recipe, cluster: Cluster, mean_turn_tokens: float) -> int:
    """The fewest environment GPUs whose evaluations of a turn take no longer than its
    generation: more would not shorten the step."""
    gen_turn = (
        recipe.trajectories
        * mean_turn_tokens
        / (cluster.gen_gpus * cluster.gen_tokens_per_s_per_gpu)
    )
    one = Cluster(**{**cluster.__dict__, "env_gpus": 1})
    alone = recipe.trajectories / (env_evals_per_s(one) * gen_turn)
    return 1 if alone <= 1 else math.ceil(alone / cluster.multi_gpu_efficiency)


def validate(jsonl: str, calibrate_share: float = 0.4) -> dict:
    """The environment part against a measured run on one GPU: the rate calibrated on the
    first evaluations of the warm pass (by completion time) predicts how long the rest took."""
    with (gzip.open if jsonl.endswith(".gz") else open)(jsonl, "rt") as f:
        results = [json.loads(line) for line in f if line.strip()]
    tasks = len({r["task_id"] for r in results})
    warm = results[tasks:] if len(results) > tasks else results  # pass 1 is one per task
    done = sorted(r["timestamp"] + r["phase_seconds"]["total"] for r in warm)
    cut = max(int(len(done) * calibrate_share), 2)
    rate = (cut - 1) / (done[cut - 1] - done[0])
    rest = len(done) - cut
    predicted = rest / rate
    measured = done[-1] - done[cut - 1]
    return {
        "calibration_evaluations": cut,
        "calibrated_evals_per_min": rate * 60,
        "predicted_evaluations": rest,
        "predicted_s": predicted,
        "measured_s": measured,
        "error": predicted / measured - 1,
        "median_latency_s": statistics.median(r["phase_seconds"]["total"] for r in warm),
    }


def _warm_records(summary_path: str) -> tuple[dict, list[dict]]:
    """A pool run of ``env_throughput.py``: its summary, and the records of its warm pass,
    read from the ``.jsonl.gz`` beside it."""
    summary = json.loads(Path(summary_path).read_text())
    records = Path(summary_path.removesuffix(".json") + ".jsonl.gz")
    if not records.exists():
        raise SystemExit(
            f"cluster_sizing.py: {summary_path} has no records beside it ({records.name}: "
            "env_throughput.py --json-out, gzipped; alternate.py keeps them)"
        )
    with gzip.open(records, "rt") as f:
        results = [json.loads(line) for line in f if line.strip()]
    return summary, results[summary["cold"]["evaluations"] if "cold" in summary else 0 :]


def _warm_pass(summary_path: str) -> tuple[dict, list[float], list[float]]:
    """A pool run's summary, and the completion times and latencies of its warm pass."""
    summary, warm = _warm_records(summary_path)
    done = sorted(r["timestamp"] + r["phase_seconds"]["total"] for r in warm)
    return summary, done, sorted(r["phase_seconds"]["total"] for r in warm)


def steady_rate(done: list[float], low: float = 0.1, high: float = 0.8) -> float:
    """Evaluations per second between the ``low`` and ``high`` shares of a batch's completions:
    the pool full, before the tail of slow evaluations."""
    a, b = int(len(done) * low), int(len(done) * high)
    return (b - a) / (done[b] - done[a])


def validate_pool(one_gpu: str, many_gpus: str) -> dict:
    """The environment part of the model against another run of the pool on one host, on
    several of its GPUs or on one again: the steady per-GPU rate of a run on one GPU predicts
    the other run (rate and batch time, the last evaluation's tail taken as the first run's p90
    latency), which the figures were not fitted on."""
    _, done_one, latencies = _warm_pass(one_gpu)
    many, done_many, _ = _warm_pass(many_gpus)
    gpus = int(many["gpus"])
    rate = steady_rate(done_one)
    tail = latencies[int(len(latencies) * 0.9)]
    n = len(done_many)
    predicted_s = n / (gpus * rate) + tail
    measured = steady_rate(done_many)
    return {
        "one_gpu_steady_evals_per_min": rate * 60,
        "gpus": gpus,
        "predicted_steady_evals_per_min": gpus * rate * 60,
        "measured_steady_evals_per_min": measured * 60,
        "per_gpu_efficiency": measured / (gpus * rate),
        "evaluations": n,
        "predicted_batch_s": predicted_s,
        "measured_batch_s": many["warm"]["wall_s"],
        "batch_error": predicted_s / many["warm"]["wall_s"] - 1,
    }


def rate_decomposition(summary_path: str) -> dict:
    """Where one GPU's rate goes, from a pool run's records. With its slots always busy, the
    rate is slots / mean latency (Little's law), and a latency is the evaluation's own work and
    the time its child was held paused while the others' measurements had the GPU; those pauses
    are about (slots - 1) exclusive windows an evaluation, so more slots buy less as the windows
    fill the GPU's time, and their own work grows with the host's load. Slots whose evaluations
    do not all fit the GPU-memory admission queue there (``admission_wait_s``, part of the own
    work) and hold no child meanwhile; once admitted, an evaluation may wait for a ready child
    (``child_wait_s``, likewise) where the spares are taken faster than they warm."""
    summary, warm = _warm_records(summary_path)
    phases = [r["phase_seconds"] for r in warm]
    slots = int(summary["warm"]["slots"])
    latency = statistics.mean(p["total"] for p in phases)
    paused = statistics.mean(p.get("paused_for_others", 0.0) for p in phases)
    window = statistics.mean(p.get("gpu_exclusive", 0.0) for p in phases)
    return {
        "slots": slots,
        "evaluations": len(warm),
        "measured_evals_per_min": summary["warm"]["evals_per_min"],
        "slots_over_mean_latency_per_min": slots / latency * 60,
        "mean_latency_s": latency,
        "own_work_s": latency - paused,
        "paused_for_others_s": paused,
        "mean_exclusive_window_s": window,
        "paused_in_windows_of_the_others": paused / ((slots - 1) * window) if slots > 1 else 0.0,
        "gpu_exclusive_share": summary["warm"]["gpu_exclusive_share"],
        "trusted_gpu_wait_s": statistics.mean(p.get("trusted_gpu_wait", 0.0) for p in phases),
        "admission_wait_s": statistics.mean(p.get("admission", 0.0) for p in phases),
        "child_wait_s": statistics.mean(p.get("child_wait", 0.0) for p in phases),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--recipe", default="recipes/qwen3-14b/trloo/drkernel_14b.yaml")
    p.add_argument("--train-gpus", type=int, default=16)
    p.add_argument("--gen-gpus", type=int, default=8)
    p.add_argument("--env-gpus", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--mean-turn-tokens", type=float, default=None, help="default: half the max")
    p.add_argument("--gen-tokens-per-s", type=float, default=VLLM_TOKENS_PER_S_PER_GPU)
    p.add_argument("--small-evals-per-min", type=float, default=SMALL_EVALS_PER_MIN)
    p.add_argument("--large-evals-per-min", type=float, default=LARGE_EVALS_PER_MIN)
    p.add_argument("--large-share", type=float, default=0.0)
    p.add_argument("--train-step-s", type=float, default=None, help="measured update time")
    p.add_argument("--validate", default="", help="an env_throughput.py --json-out file")
    p.add_argument(
        "--validate-pool",
        nargs=2,
        metavar=("ONE_GPU", "MANY_GPUS"),
        help="two env_throughput.py --summary-out files of one host: 1 GPU, then another run",
    )
    p.add_argument(
        "--decompose",
        nargs="+",
        metavar="RUN",
        help="env_throughput.py --summary-out files: each one's rate as slots over latency",
    )
    args = p.parse_args()
    if args.decompose:
        for run in args.decompose:
            print(json.dumps({"run": run, **rate_decomposition(run)}, indent=1))
        return
    if args.validate:
        print(json.dumps(validate(args.validate), indent=1))
        return
    if args.validate_pool:
        print(json.dumps(validate_pool(*args.validate_pool), indent=1))
        return
    recipe = Recipe.load(args.recipe, args.train_gpus)
    tokens = args.mean_turn_tokens or recipe.max_turn_tokens / 2
    print(
        f"{args.recipe}: {recipe.trajectories} trajectories x {recipe.turns} turns, "
        f"{tokens:.0f} tokens per turn, {recipe.params / 1e9:.0f}B parameters"
    )
    print("| env GPUs | step s | generation s | environment s | training s | bound |")
    print("| ---: | ---: | ---: | ---: | ---: | --- |")
    cluster = None
    for m in args.env_gpus:
        cluster = Cluster(
            args.train_gpus, args.gen_gpus, m, args.gen_tokens_per_s, args.small_evals_per_min,
            args.large_evals_per_min, args.large_share,
        )  # fmt: skip
        r = predict(recipe, cluster, tokens, args.train_step_s)
        print(
            f"| {m} | {r['step_s']:.0f} | {r['generation_s']:.0f} | {r['environment_s']:.0f} | "
            f"{r['training_s']:.0f} | {r['bound']} |"
        )
    assert cluster is not None
    print(f"recommended environment GPUs: {recommend_env_gpus(recipe, cluster, tokens)}")


if __name__ == "__main__":
    main()
