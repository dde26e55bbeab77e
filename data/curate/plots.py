"""Plots for the dataset card (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from datasets import Dataset  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from kernelrl.data.curate.report import StepReport  # noqa: E402


def _bar(counts: Counter[str], title: str, path: Path, xlabel: str = "") -> Path:
    labels = sorted(counts, key=lambda k: (-counts[k], k))
    fig, ax = plt.subplots(figsize=(max(4.0, 0.6 * len(labels) + 2), 3.2))
    ax.bar(range(len(labels)), [counts[k] for k in labels], color="#4c72b0")
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
    ax.set_ylabel("count")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_steps(reports: list[StepReport], path: Path) -> Path:
    """Records in and out of every step."""
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(reports) + 2), 3.4))
    xs = range(len(reports))
    ax.bar(
        [x - 0.2 for x in xs], [r.count_in for r in reports], width=0.4, label="in", color="#999999"
    )
    ax.bar(
        [x + 0.2 for x in xs],
        [r.count_out for r in reports],
        width=0.4,
        label="out",
        color="#4c72b0",
    )
    ax.set_xticks(list(xs), [r.step for r in reports], rotation=30, ha="right")
    ax.set_ylabel("records")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("curation steps: records in and out")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_runtimes(runtimes_ms: list[float], device: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(5.0, 3.2))
    ax.hist(runtimes_ms, bins=min(20, max(len(runtimes_ms), 1)), color="#55a868")
    if runtimes_ms and min(runtimes_ms) > 0 and max(runtimes_ms) / min(runtimes_ms) > 20:
        ax.set_xscale("log")
    ax.set_xlabel(f"reference median runtime (ms) on {device}")
    ax.set_ylabel("tasks")
    ax.set_title("reference runtimes")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_reasoning(tokens: list[int], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(5.0, 3.2))
    ax.hist(tokens, bins=min(20, max(len(tokens), 1)), color="#c44e52")
    ax.set_xlabel("reasoning length (word/punctuation tokens)")
    ax.set_ylabel("SFT examples")
    ax.set_title("reasoning length of selected SFT examples")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def make_plots(
    tasks: Dataset, sft: Dataset | None, reports: list[StepReport], folder: Path
) -> dict[str, Path]:
    """Every plot the data allows, as PNG files under ``folder``; returns name -> path."""
    folder.mkdir(parents=True, exist_ok=True)
    plots = {"steps": plot_steps(reports, folder / "steps.png")}
    if len(tasks):
        plots["op_categories"] = _bar(
            Counter(c for cats in tasks["op_categories"] for c in (cats or ["untagged"])),
            "operator categories of tasks",
            folder / "op_categories.png",
        )
        plots["difficulty"] = _bar(
            Counter(d or "untagged" for d in tasks["difficulty"]),
            "task difficulty",
            folder / "difficulty.png",
        )
        runtimes = [r for r in tasks["ref_runtime_ms"] if r is not None]
        if runtimes:
            device = next((d for d in tasks["ref_device"] if d), "?")
            plots["runtimes"] = plot_runtimes(runtimes, device, folder / "runtimes.png")
    if sft is not None and len(sft):
        plots["reasoning"] = plot_reasoning(
            list(sft["reasoning_tokens"]), folder / "reasoning_tokens.png"
        )
        plots["sft_per_task"] = _bar(
            Counter(sft["task_id"]), "SFT examples per task", folder / "sft_per_task.png"
        )
    return plots
