"""The learning benchmark's statistics, plot and table.

Kept apart from ``learning.py`` (which runs the stages) so that the statistics can be read and
tested on their own. A run's intervals (``estimate``) are percentile bootstraps over tasks (the
unit of held-out generalisation), then over the samples of each task for per-attempt rates;
differences between stages resample the same tasks for both (paired). RL - SFT over several
runs (``pooled``) resamples seeds and tasks, the two sources of its spread.
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


#: The pooled analysis's bootstrap (docs/learning-protocol.md, "Analysis"): fixed before any run.
POOLED_RESAMPLES = 10_000
POOLED_SEED = 20261130


def cell_matrix(
    runs_by_seed: dict[int, dict[str, dict[str, list[dict[str, float]]]]],
    sft: str,
    rl: str,
    k: int,
) -> tuple[list[int], list[str], dict[str, np.ndarray]]:
    """(seeds, tasks, name -> seeds x tasks matrix): a cell is one task in one seed's run.
    ``sft`` and ``rl``: each stage's mean correctness over the task's scored answers;
    ``correct``: their difference (RL - SFT, correct@1); ``pass@k``: the difference of their
    pass@k. NaN where either stage has fewer than ``k`` scored answers to the task (a harness
    error left it unjudged)."""
    seeds = sorted(runs_by_seed)
    tasks = sorted(
        {t for runs in runs_by_seed.values() for s in (sft, rl) for t in runs.get(s, {})}
    )
    names = (sft, rl, "correct", f"pass@{k}")
    cells = {m: np.full((len(seeds), len(tasks)), np.nan) for m in names}
    for i, seed in enumerate(seeds):
        runs = runs_by_seed[seed]
        for j, task in enumerate(tasks):
            answers = [runs.get(stage, {}).get(task, []) for stage in (sft, rl)]
            if min(len(a) for a in answers) < k:
                continue
            before, after = (np.array([a["correct"] for a in stage]) for stage in answers)
            cells[sft][i, j], cells[rl][i, j] = before.mean(), after.mean()
            cells["correct"][i, j] = after.mean() - before.mean()
            cells[f"pass@{k}"][i, j] = _pass_at_k(after, k) - _pass_at_k(before, k)
    return seeds, tasks, cells


def two_way_bootstrap(
    cells: np.ndarray, resamples: int = POOLED_RESAMPLES, seed: int = POOLED_SEED
) -> dict[str, Any]:
    """The mean of a seeds x tasks matrix of paired differences, with a 95% percentile interval
    from a bootstrap that resamples seeds and tasks independently, each with replacement (the
    two are crossed: every seed's run answers the same tasks): a resample draws |S| seeds and
    |T| tasks, and its statistic is the mean over the drawn grid's judged cells, a seed or task
    drawn twice counting twice. Draws: ``numpy.random.default_rng(seed)``, then for each
    resample ``integers(0, |S|, |S|)`` and ``integers(0, |T|, |T|)``, in that order."""
    judged = ~np.isnan(cells)
    if not judged.any():
        raise ValueError("no task was judged at both stages in any seed")
    values = np.where(judged, cells, 0.0)
    n_seeds, n_tasks = cells.shape
    rng = np.random.default_rng(seed)
    stats = np.empty(resamples)
    for b in range(resamples):
        seed_counts = np.bincount(rng.integers(0, n_seeds, n_seeds), minlength=n_seeds)
        task_counts = np.bincount(rng.integers(0, n_tasks, n_tasks), minlength=n_tasks)
        weight = seed_counts[:, None] * task_counts[None, :] * judged
        total = weight.sum()
        stats[b] = (weight * values).sum() / total if total else np.nan
    stats = stats[~np.isnan(stats)]
    return {
        "gain": float(values[judged].mean()),
        "ci_low": float(np.quantile(stats, 0.025)),
        "ci_high": float(np.quantile(stats, 0.975)),
        "cells": int(judged.sum()),
    }


def pooled(
    runs_by_seed: dict[int, dict[str, dict[str, list[dict[str, float]]]]],
    k: int,
    sft: str = "sft",
    rl: str = "rl",
    resamples: int = POOLED_RESAMPLES,
    seed: int = POOLED_SEED,
) -> dict[str, Any]:
    """RL - SFT pooled over seeds (``two_way_bootstrap``), and for each seed over its tasks
    alone (the same bootstrap on its row), for correct@1 and pass@k; with each stage's mean
    over the judged cells."""
    seeds, tasks, cells = cell_matrix(runs_by_seed, sft, rl, k)

    def summary(rows: slice) -> dict[str, Any]:
        judged = ~np.isnan(cells["correct"][rows])
        return {
            **two_way_bootstrap(cells["correct"][rows], resamples, seed),
            sft: float(cells[sft][rows][judged].mean()),
            rl: float(cells[rl][rows][judged].mean()),
            f"pass@{k}": two_way_bootstrap(cells[f"pass@{k}"][rows], resamples, seed),
        }

    per_seed = {
        str(run_seed): summary(slice(i, i + 1))
        for i, run_seed in enumerate(seeds)
        if not np.isnan(cells["correct"][i]).all()
    }
    return {
        **summary(slice(None)),
        "metric": "correct@1",
        "seeds": seeds,
        "tasks": len(tasks),
        "k": k,
        "resamples": resamples,
        "bootstrap_seed": seed,
        "per_seed": per_seed,
    }


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
