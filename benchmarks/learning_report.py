"""The learning benchmark's numbers: per-attempt outcomes, bootstrap intervals, plot and table.

Kept apart from ``learning.py`` (which runs the stages) so that the statistics can be read and
tested on their own. Intervals are percentile bootstraps over tasks (the unit of held-out
generalisation), then over the samples of each task for per-attempt rates; differences between
stages resample the same tasks for both (paired).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

#: per-attempt metric -> label. ``token_limit``: the answer ran into max_tokens (vLLM's
#: finish_reason "length"); ``integrity``: refused by an integrity check.
ATTEMPT_METRICS = {
    "correct": "correct@1",
    "format_error": "format error rate",
    "token_limit": "token-limit rate",
    "compile": "compile rate",
    "integrity": "integrity violation rate",
    "reward": "mean reward",
}
RATES = tuple(m for m in ATTEMPT_METRICS if m != "reward")


def attempts(samples_path: Path, reward_config: Any) -> dict[str, list[dict[str, float]]]:
    """task id -> per-sample outcomes of the final turn; harness errors are left out (unscored:
    a failure of ours is never counted against the model)."""
    from kernelrl.env.result import Status
    from kernelrl.eval.metrics import compiled, last_view
    from kernelrl.eval.records import read_records
    from kernelrl.rewards import is_scored, total_reward

    by_task: dict[str, list[dict[str, float]]] = {}
    for record in last_view(read_records(samples_path)):
        result = record.result
        if not is_scored(result):
            continue
        by_task.setdefault(record.task_id, []).append(
            {
                "correct": float(bool(result.correct)),
                "format_error": float(result.status is Status.FORMAT_ERROR),
                "token_limit": float(record.finish_reason == "length"),
                "compile": float(compiled(result)),
                "integrity": float(result.status is Status.INTEGRITY_VIOLATION),
                "reward": float(total_reward(result, reward_config)),
            }
        )
    return by_task


def _pass_at_k(rows: np.ndarray, k: int) -> float:
    from kernelrl.eval.estimators import pass_at_k

    return pass_at_k(len(rows), int(rows.sum()), k)


def estimate(
    runs: dict[str, dict[str, list[dict[str, float]]]],
    tasks: list[str],
    k: int,
    resamples: int,
    seed: int,
) -> dict[str, Any]:
    """Per stage: each metric's mean with its bootstrap interval (and Wilson for rates); per pair
    of stages: the difference with its paired interval. Only tasks every stage scored count."""
    from kernelrl.eval.estimators import wilson_interval

    scored = [t for t in tasks if all(len(runs[s].get(t, [])) >= k for s in runs)]
    if not scored:
        raise ValueError(f"no task has {k} scored attempts in every stage")
    per_task = {
        stage: {
            metric: [np.array([a[metric] for a in runs[stage][t]]) for t in scored]
            for metric in ATTEMPT_METRICS
        }
        for stage in runs
    }
    rng = np.random.default_rng(seed)
    task_draws = [rng.integers(0, len(scored), len(scored)) for _ in range(resamples)]
    sample_seeds = rng.integers(0, 2**32, resamples)
    pass_key = f"pass@{k}"
    table: dict[str, Any] = {"stages": {}, "differences": {}, "scored_tasks": scored, "k": k}
    boot: dict[str, dict[str, np.ndarray]] = {}
    for stage, metrics in per_task.items():
        table["stages"][stage], boot[stage] = {}, {}
        for metric, rows in metrics.items():
            values = np.concatenate(rows)
            stats = np.empty(resamples)
            for i, (draw, sample_seed) in enumerate(zip(task_draws, sample_seeds, strict=True)):
                inner = np.random.default_rng(sample_seed)  # same inner draws for every stage
                stats[i] = np.concatenate(
                    [rows[t][inner.integers(0, len(rows[t]), len(rows[t]))] for t in draw]
                ).mean()
            boot[stage][metric] = stats
            entry = _entry(float(values.mean()), stats, int(values.size), len(scored))
            if metric in RATES:
                entry["wilson"] = list(wilson_interval(int(values.sum()), int(values.size)))
            table["stages"][stage][metric] = entry
        per_task_pass = np.array([_pass_at_k(rows, k) for rows in metrics["correct"]])
        stats = np.array([per_task_pass[draw].mean() for draw in task_draws])
        boot[stage][pass_key] = stats
        table["stages"][stage][pass_key] = _entry(
            float(per_task_pass.mean()), stats, len(scored), len(scored)
        )
    names = list(runs)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            row = table["differences"][f"{b} - {a}"] = {}
            for metric in [*ATTEMPT_METRICS, pass_key]:
                diff = boot[b][metric] - boot[a][metric]
                low, high = float(np.quantile(diff, 0.025)), float(np.quantile(diff, 0.975))
                row[metric] = {
                    "value": table["stages"][b][metric]["value"]
                    - table["stages"][a][metric]["value"],
                    "bootstrap": [low, high],
                    "excludes_zero": bool(low > 0 or high < 0),
                }
    return table


def _entry(value: float, stats: np.ndarray, n: int, tasks: int) -> dict[str, Any]:
    return {
        "value": value,
        "n": n,
        "tasks": tasks,
        "bootstrap": [float(np.quantile(stats, 0.025)), float(np.quantile(stats, 0.975))],
    }


# ---------------------------------------------------------------------------------- curves
def sft_curve(summary_path: Path) -> list[tuple[float, float]]:
    import json

    if not summary_path.exists():
        return []
    history = json.loads(summary_path.read_text()).get("log_history", [])
    return [(h["step"], h["loss"]) for h in history if "loss" in h and "step" in h]


def checkpoint_step(folder: Path) -> int:
    """The optimizer step of a Trainer ``checkpoint-N`` folder."""
    return int(folder.name.split("-")[1])


def rl_curve(rl_dir: Path) -> list[dict[str, float]]:
    """The per-step log of the latest RL checkpoint (it holds every earlier step too)."""
    import json

    states = sorted(
        rl_dir.glob("checkpoint-*/trainer_state.json"),
        key=lambda p: checkpoint_step(p.parent),
    )
    if not states:
        return []
    history = json.loads(states[-1].read_text()).get("log_history", [])
    return [h for h in history if "reward" in h]


def plot(
    table: dict[str, Any],
    labels: dict[str, str],
    sft: list[tuple[float, float]],
    rl: dict[str, list[dict[str, float]]],
    path: Path,
    title: str,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(22, 7.5))
    shown = ["correct", f"pass@{table['k']}", "format_error", "token_limit", "integrity"]
    stages = list(table["stages"])
    width = 0.8 / len(stages)
    for i, stage in enumerate(stages):
        entries = [table["stages"][stage][m] for m in shown]
        xs = [j + (i - (len(stages) - 1) / 2) * width for j in range(len(shown))]
        ys = [e["value"] for e in entries]
        err = [[e["value"] - e["bootstrap"][0] for e in entries]]
        err.append([e["bootstrap"][1] - e["value"] for e in entries])
        axes[0].bar(xs, ys, width, yerr=err, capsize=3, label=labels.get(stage, stage))
    axes[0].set_xticks(range(len(shown)))
    axes[0].set_xticklabels(
        [ATTEMPT_METRICS.get(m, m).replace(" rate", "\nrate") for m in shown], fontsize=8
    )
    axes[0].set_title("held-out tasks (95% bootstrap)")
    # Legends go below the axes: the runs' long labels would hide the bars and curves.
    axes[0].legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    if sft:
        axes[1].plot([s for s, _ in sft], [loss for _, loss in sft], marker=".")
    axes[1].set_title("SFT: training loss (completion tokens)")
    axes[1].set_xlabel("step")
    twin = axes[3].twinx()
    twin.set_ylim(0, 1)
    # A run's curves in its held-out bar's colour, one line style per quantity.
    colors = {
        labels.get(st, st).removeprefix("after "): f"C{i % 10}" for i, st in enumerate(stages)
    }
    for index, (name, curve) in enumerate(rl.items()):
        color = colors.get(name, f"C{(len(stages) + index) % 10}")
        steps = [h.get("step", i + 1) for i, h in enumerate(curve)]
        for key, label, style in (
            ("reward", "mean reward", "-"),
            ("env/correct_final", "correct rate (train rollouts)", "--"),
            ("env/format_error", "format_error share", ":"),
        ):
            if curve and all(key in h for h in curve):
                ys = [h[key] for h in curve]
                axes[2].plot(steps, ys, style, color=color, marker=".", label=f"{name}: {label}")
        for key, label, style in (
            ("completions/mean_length", "mean completion tokens", "-"),
            ("completions/max_length", "max completion tokens", "--"),
        ):
            if curve and all(key in h for h in curve):
                ys = [h[key] for h in curve]
                axes[3].plot(steps, ys, style, color=color, marker=".", label=f"{name}: {label}")
        clipped = "completions/clipped_ratio"
        if curve and all(clipped in h for h in curve):
            ys = [h[clipped] for h in curve]
            twin.plot(steps, ys, ":", color=color, label=f"{name}: token-limit share")
    axes[2].set_title("RL on train tasks, per step")
    axes[2].set_xlabel("step")
    axes[2].legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    twin.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.33))
    axes[3].set_title("RL: completion lengths")
    axes[3].set_xlabel("step")
    axes[3].legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    fig.suptitle(title)
    fig.subplots_adjust(left=0.04, right=0.97, top=0.9, bottom=0.42, wspace=0.3)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def markdown(
    table: dict[str, Any],
    labels: dict[str, str],
    stage_runs: dict[str, Any],
    scope: str = "Held-out",
) -> str:
    def cell(entry: dict[str, Any]) -> str:
        low, high = entry["bootstrap"]
        return f"{entry['value']:.3f} [{low:.3f}, {high:.3f}]"

    metrics = ["correct", f"pass@{table['k']}", *[m for m in ATTEMPT_METRICS if m != "correct"]]
    names = [ATTEMPT_METRICS.get(m, m) for m in metrics]
    first = next(iter(table["stages"].values()))
    lines = [
        f"{scope}: {len(table['scored_tasks'])} tasks, {first['correct']['n']} scored attempts "
        "per stage.",
        "",
        "| stage | " + " | ".join(names) + " |",
        "| --- |" + " ---: |" * len(metrics),
    ]
    for stage, row in table["stages"].items():
        cells = " | ".join(cell(row[m]) for m in metrics)
        lines.append(f"| {labels.get(stage, stage)} | {cells} |")
    lines += [
        "",
        "| difference | " + " | ".join(names) + " |",
        "| --- |" + " ---: |" * len(metrics),
    ]
    for key, row in table["differences"].items():
        b, a = key.split(" - ")
        cells = " | ".join(
            cell(row[m]) + (" *" if row[m]["excludes_zero"] else "") for m in metrics
        )
        lines.append(f"| {labels.get(b, b)} - {labels.get(a, a)} | {cells} |")
    lines += [
        "",
        "95% percentile bootstrap: tasks resampled, then the samples of each task; differences "
        "paired by task. * = the interval excludes 0.",
        "",
        "| stage | wall min | peak RSS GB | load avg start/end |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, info in stage_runs.items():
        if isinstance(info, dict) and "wall_s" in info:
            lines.append(
                f"| {name} | {info['wall_s'] / 60:.1f} | {info.get('peak_rss_gb')} | "
                f"{info.get('load_avg_start')} / {info.get('load_avg_end')} |"
            )
    return "\n".join(lines) + "\n"
