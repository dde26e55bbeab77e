"""Synchronous against asynchronous RL, side by side, on one recipe.

Runs the same recipe once per arm, one after the other on the same machine: the synchronous
trainer, then ``async_generation`` with each ``--staleness``. For each it reads the run's
``train_summary.json`` (the reward of every step; the last step's ``async/*``, ``rollout/*``
and timing metrics) and its console log for steps per hour (``train: N/N (100%) ... done in
H:MM:SS``: the training itself; model loading and the start-up of the vLLM server and the
environment are left out, they are the same in every arm). Prints a table (with each arm's mean
reward, its standard error over steps and its distance to the synchronous mean in standard
errors) and writes ``results.json`` and ``results.md`` under ``--out``; the runs themselves go
to ``--out/runs``.

    # the CPU topology: a vLLM server, the environment service, two trainer ranks
    python benchmarks/async_rl.py --launcher topology \\
        --config recipes/smoke/server_cpu.yaml --steps 3 --out OUT
    # one GPU, transformers generation (no vLLM), the environment on the CPU cores (on the
    # policy's GPU it would time kernels beside generation: refused); one arm per call with
    # --arms, the table over every arm under OUT
    python benchmarks/async_rl.py --launcher train \\
        --config recipes/smollm2/trloo/gpu_one_device.yaml --steps 10 --out OUT \\
        --arms sync -- --env_device cpu --env_workers 8

Flags after ``--`` go to every run's ``kernelrl train``; ``--reanalyse`` rebuilds the table from
the runs under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def arms(staleness: list[int]) -> list[tuple[str, list[str]]]:
    """(name, extra training flags) of every run, the synchronous one first."""
    out = [("sync", [])]
    for s in staleness:
        out.append((f"async_s{s}", ["--async_generation", "true", "--max_staleness", str(s)]))
    return out


def command(launcher: str, config: str, output: Path, steps: int, flags: list[str]) -> list[str]:
    train = ["--output_dir", str(output), "--max_steps", str(steps), "--save_strategy", "no"]
    train += ["--report_to", "none", *flags]
    cli = [sys.executable, "-m", "kernelrl.launch.cli"]
    if launcher == "topology":
        return [*cli, "topology", "--train_config", config, "--num_processes", "2", "--", *train]
    return [*cli, "train", "--config", config, *train]


PER_STEP = ("async/", "rollout/", "timing/", "step_time")  # the last step's, kept
DONE = re.compile(r"train: (\d+)/\d+ \(100%\).*done in (\d+):(\d\d):(\d\d)")


def read_run(output: Path, log: Path) -> dict[str, Any]:
    """Steps per hour and the per-step rewards of one run: the rewards from its
    ``train_summary.json``, the training time from its ``done in H:MM:SS`` line (from the start
    of training to its end: model loading and the start-up of the server and the environment are
    left out, they are the same in every arm; 1 s resolution), and the last step's full log
    (staleness, carried groups, the trainer's wait for generation). The rate without the first
    step, from the summary's ``step_seconds``, is the steady state: an asynchronous run's
    first step has nothing to overlap with."""
    summary_file = output / "train_summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    steps = summary.get("steps", [])
    done = DONE.findall(log.read_text(errors="replace")) if log.exists() else []
    runtime = max((int(h) * 3600 + int(m) * 60 + int(s) for _, h, m, s in done), default=None)
    last = summary.get("last_log", {})
    later = summary.get("step_seconds", [])[1:]  # recorded since the summary kept step times
    return {
        "steps": len(steps),
        "train_runtime_s": runtime,
        "steps_per_hour": len(steps) / runtime * 3600 if runtime else None,
        "steps_per_hour_after_first": len(later) / sum(later) * 3600 if sum(later) else None,
        "rewards": [e["reward"] for e in steps],
        "last_step": {k: v for k, v in last.items() if k.startswith(PER_STEP)},
    }


def noise(rewards: list[float]) -> tuple[float, float]:
    """Mean reward and its standard error over the steps (steps as independent draws)."""
    if not rewards:
        return math.nan, math.nan
    se = statistics.stdev(rewards) / math.sqrt(len(rewards)) if len(rewards) > 1 else math.nan
    return statistics.fmean(rewards), se


def summary(results: dict[str, dict[str, Any]]) -> str:
    """The table: steps/hour, its ratio to the synchronous run, the mean reward with its
    standard error, the difference to the synchronous mean in combined standard errors (within
    2: within noise), and the reward curve."""
    sync = results.get("sync", {"rewards": []})
    base_mean, base_se = noise(sync["rewards"])
    lines = [
        "| run | steps | steps/hour | x sync | after step 1 | x sync | mean reward +- SE "
        "| vs sync (SE) | reward per step |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in results.items():
        rates = [
            _rate_and_ratio(r.get(key), sync.get(key))
            for key in ("steps_per_hour", "steps_per_hour_after_first")
        ]
        mean, se = noise(r["rewards"])
        gap = "-"
        if name != "sync" and math.hypot(se, base_se) > 0:  # nan when a side has one step
            gap = f"{(mean - base_mean) / math.hypot(se, base_se):+.1f}"
        curve = " ".join(f"{x:.3f}" for x in r["rewards"])
        lines.append(
            f"| {name} | {r['steps']} | {' | '.join(rates)} | {mean:.3f} +- {se:.3f} | {gap} "
            f"| {curve} |"
        )
    return "\n".join(lines)


def _rate_and_ratio(rate: float | None, sync_rate: float | None) -> str:
    shown = f"{rate:.1f}" if rate else "-"
    return f"{shown} | {rate / sync_rate:.2f}" if rate and sync_rate else f"{shown} | -"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the training recipe")
    parser.add_argument("--launcher", choices=("train", "topology"), default="train")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--staleness", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--out", required=True, help="folder for the runs and the results")
    parser.add_argument("--timeout-s", type=float, default=3600.0, help="per run")
    parser.add_argument(
        "--reanalyse", action="store_true", help="read the runs already under --out, run nothing"
    )
    parser.add_argument(
        "--arms",
        nargs="+",
        help="run only these (sync, async_s1, ...); the others already under --out are read",
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    for name, flags in arms(args.staleness):
        run_dir, log = out / "runs" / name, out / f"{name}.log"
        if args.reanalyse or (args.arms and name not in args.arms):
            if log.exists():  # an arm run earlier (e.g. by another call)
                results[name] = {**read_run(run_dir, log), "exit_code": 0}
            continue
        cmd = command(args.launcher, args.config, run_dir, args.steps, [*extra, *flags])
        print(f"[{name}] {' '.join(cmd[1:])}", flush=True)
        started = time.perf_counter()
        with log.open("w") as stream:
            code = subprocess.run(
                cmd, stdout=stream, stderr=subprocess.STDOUT, timeout=args.timeout_s
            )
        results[name] = {**read_run(run_dir, log), "exit_code": code.returncode}
        results[name]["wall_s"] = time.perf_counter() - started
        print(f"[{name}] exit {code.returncode}, {results[name]['steps']} steps", flush=True)
    table = summary(results)
    print(table)
    setup = {"config": args.config, "launcher": args.launcher, "steps": args.steps, "flags": extra}
    (out / "results.json").write_text(json.dumps({"setup": setup, "runs": results}, indent=1))
    (out / "results.md").write_text(f"{json.dumps(setup)}\n\n{table}\n")
    return 0 if all(r["exit_code"] == 0 for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
