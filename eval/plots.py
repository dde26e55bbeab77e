"""Report plots (matplotlib, headless): speedup distribution, fast_p over p, per-level bars,
turn-by-turn progress. Each plot says so on its face when there is nothing to draw (CPU runs
have no meaningful timings) instead of being left out, so a report always has the same shape."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kernelrl.eval.metrics import BASELINES, best_view, is_fast, speedup
from kernelrl.eval.records import SampleRecord

_COLORS = {"eager": "#1f77b4", "compile": "#ff7f0e"}


def _figure(width: float = 6.4, height: float = 4.0) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, height), dpi=110)


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")


def speedup_distribution(records: Sequence[SampleRecord], path: Path) -> Path:
    view = best_view(records)
    fig, ax = _figure()
    drawn = False
    for baseline in BASELINES:
        values = [s for r in view if (s := speedup(r.result, baseline)) is not None]
        if values:
            drawn = True
            logs = [math.log2(v) for v in values]
            bins = max(5, min(30, len(values)))
            ax.hist(
                logs,
                bins=bins,
                alpha=0.6,
                color=_COLORS[baseline],
                label=f"vs {baseline} (n={len(values)})",
            )
    if drawn:
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_xlabel("speedup (log2; right of 0 is faster than the baseline)")
        ax.set_ylabel("correct solutions")
        ax.legend()
    else:
        _empty(ax, "no timed correct solutions\n(timings are only meaningful on a GPU)")
    ax.set_title("Speedup of correct solutions (best turn)")
    return _save(fig, path)


def fast_p_curve(records: Sequence[SampleRecord], path: Path, max_p: float = 3.0) -> Path:
    view = best_view(records)
    fig, ax = _figure()
    ps = [i * max_p / 120 for i in range(121)]
    drawn = False
    for baseline in BASELINES:
        timed = any(speedup(r.result, baseline) is not None for r in view)
        if not view or not timed:
            continue
        drawn = True
        values = [sum(is_fast(r.result, p, baseline) for r in view) / len(view) for p in ps]
        ax.step(ps, values, where="post", color=_COLORS[baseline], label=f"vs {baseline}")
    if drawn:
        for p in (1.0, 1.2, 2.0):
            ax.axvline(p, color="gray", linewidth=0.5, linestyle=":")
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("speedup threshold p")
        ax.set_ylabel("fast_p (correct and speedup > p)")
        ax.legend()
    else:
        _empty(ax, "no timed correct solutions\n(timings are only meaningful on a GPU)")
    ax.set_title("fast_p over p (best turn)")
    return _save(fig, path)


def level_bars(summary: dict[str, Any], path: Path) -> Path:
    """Correctness and fast_1 per level (best turn); per category when tasks have no level
    (kernelrl's own suite), the whole sweep when they have neither."""
    view = summary["views"]["best"]
    groups = view["levels"] or view["categories"] or {"all": view["overall"]}
    kind = "level" if view["levels"] else "category" if view["categories"] else ""
    metrics = [
        ("correct", lambda s: s["correct_rate"]["value"]),
        ("fast_1 eager", lambda s: s["fast_p"]["eager"]["1"]["value"]),
        ("fast_1 compile", lambda s: s["fast_p"]["compile"]["1"]["value"]),
    ]
    fig, ax = _figure()
    width = 0.8 / len(metrics)
    names = list(groups)
    for i, (label, get) in enumerate(metrics):
        values = [get(groups[name]) for name in names]
        xs = [j + (i - (len(metrics) - 1) / 2) * width for j in range(len(names))]
        ax.bar(xs, [v or 0.0 for v in values], width, label=label)
        for x, v in zip(xs, values, strict=True):
            ax.text(
                x, (v or 0.0) + 0.01, "n/a" if v is None else f"{v:.0%}", ha="center", fontsize=7
            )
    ax.set_xticks(range(len(names)))
    labels = [f"level {n}" if kind == "level" else n if kind else "all tasks" for n in names]
    ax.set_xticklabels(
        labels,
        rotation=30 if len(names) > 4 else 0,
        ha="right" if len(names) > 4 else "center",
        fontsize=8,
    )
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("share of attempts")
    ax.set_title(f"Per {kind or 'sweep'} (best turn)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def turn_progress(summary: dict[str, Any], path: Path) -> Path:
    curve = summary["turns"]
    fig, ax = _figure()
    if curve:
        turns = [point["turn"] + 1 for point in curve]
        series = [
            ("correct at this turn", [p["correct_at_turn"]["value"] for p in curve]),
            ("correct, best so far", [p["best_so_far"]["correct_rate"]["value"] for p in curve]),
            ("compiled, best so far", [p["best_so_far"]["compile_rate"]["value"] for p in curve]),
            (
                "fast_1 eager, best so far",
                [p["best_so_far"]["fast_p"]["eager"]["1"]["value"] for p in curve],
            ),
        ]
        for label, values in series:
            if any(v is not None for v in values):
                ax.plot(
                    turns,
                    [v if v is not None else math.nan for v in values],
                    marker="o",
                    label=label,
                )
        ax.set_xticks(turns)
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("turn")
        ax.set_ylabel("share of samples")
        ax.legend(fontsize=8)
    else:
        _empty(ax, "no attempts")
    ax.set_title("Turn by turn")
    return _save(fig, path)


def write_plots(
    records: Sequence[SampleRecord], summary: dict[str, Any], folder: Path
) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    return {
        "speedup distribution": speedup_distribution(records, folder / "speedup_distribution.png"),
        "fast_p over p": fast_p_curve(records, folder / "fast_p.png"),
        "per level": level_bars(summary, folder / "levels.png"),
        "turn by turn": turn_progress(summary, folder / "turns.png"),
    }
