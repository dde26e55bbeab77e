"""Report plots (matplotlib, headless): speedup distribution, fast_p over p, per-level (or
per-category) bars, turn-by-turn progress. A plot with nothing to show is not drawn at all (a
CPU run has no meaningful timings; a one-turn run has no turn-by-turn progress): ``write_plots``
returns why, and the report says so in its place, instead of linking an empty picture."""

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


NO_TIMINGS = "no correct solution has a meaningful speedup (timings mean something on a GPU only)"


def timed_speedups(records: Sequence[SampleRecord]) -> dict[str, list[float]]:
    """Speedups of the correct attempts of the best view, per baseline (empty on CPU runs)."""
    view = best_view(records)
    return {
        baseline: [s for r in view if (s := speedup(r.result, baseline)) is not None]
        for baseline in BASELINES
    }


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
    ax.set_title("fast_p over p (best turn)")
    return _save(fig, path)


def group_kind(summary: dict[str, Any]) -> str:
    """What ``levels.png`` and the report's group table show: ``level``, else ``category``
    (kernelrl's own suite has no levels), else ``sweep`` (one bar group for everything)."""
    view = summary["views"]["best"]
    return "level" if view["levels"] else "category" if view["categories"] else "sweep"


def level_bars(summary: dict[str, Any], path: Path) -> Path:
    """Correctness and fast_1 per level (best turn); per category when tasks have no level
    (kernelrl's own suite), the whole sweep when they have neither. A metric that is n/a in
    every group (fast_1 on a CPU run) is left out and named under the axis."""
    view = summary["views"]["best"]
    kind = group_kind(summary)
    groups = {"level": view["levels"], "category": view["categories"]}.get(kind) or {
        "all": view["overall"]
    }
    candidates = [
        ("correct", lambda s: s["correct_rate"]["value"]),
        ("fast_1 vs eager", lambda s: s["fast_p"]["eager"]["1"]["value"]),
        ("fast_1 vs compile", lambda s: s["fast_p"]["compile"]["1"]["value"]),
    ]
    names = list(groups)
    metrics = [
        (label, get)
        for label, get in candidates
        if any(get(groups[name]) is not None for name in names)
    ]
    missing = [label for label, get in candidates if all(get(groups[n]) is None for n in names)]
    fig, ax = _figure(max(6.4, 0.9 * len(names) + 2), 4.2)
    width = 0.8 / len(metrics)
    for i, (label, get) in enumerate(metrics):
        values = [get(groups[name]) for name in names]
        xs = [j + (i - (len(metrics) - 1) / 2) * width for j in range(len(names))]
        ax.bar(xs, [v or 0.0 for v in values], width, label=label)
        for x, v in zip(xs, values, strict=True):
            ax.text(
                x,
                (v or 0.0) + 0.01,
                "n/a" if v is None else f"{v:.0%}",
                ha="center",
                fontsize=7,
                rotation=90 if len(metrics) > 1 and len(names) > 6 else 0,
            )
    ax.set_xticks(range(len(names)))
    labels = [
        f"level {n}" if kind == "level" else n if kind == "category" else "all tasks" for n in names
    ]
    ax.set_xticklabels(
        labels,
        rotation=30 if len(names) > 4 else 0,
        ha="right" if len(names) > 4 else "center",
        fontsize=8,
    )
    ax.set_ylim(0, 1.15)
    ax.set_ylabel("share of attempts")
    if missing:
        ax.set_xlabel(f"n/a, not drawn: {', '.join(missing)} (no meaningful timings)", fontsize=8)
    ax.set_title(f"Per {kind} (best turn)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def turn_progress(summary: dict[str, Any], path: Path) -> Path:
    """Refinement, turn by turn. Lines often coincide (correct at a turn = correct so far on
    the first turn), so each has its own marker, dash and width, the widest drawn first."""
    curve = summary["turns"]
    fig, ax = _figure()
    turns = [point["turn"] + 1 for point in curve]
    series = [
        ("compiled, best so far", [p["best_so_far"]["compile_rate"]["value"] for p in curve]),
        ("correct, best so far", [p["best_so_far"]["correct_rate"]["value"] for p in curve]),
        ("correct at this turn", [p["correct_at_turn"]["value"] for p in curve]),
        (
            "fast_1 vs eager, best so far",
            [p["best_so_far"]["fast_p"]["eager"]["1"]["value"] for p in curve],
        ),
    ]
    styles = [("s", "-", 4.0), ("o", "--", 2.5), ("^", ":", 1.5), ("D", "-.", 1.5)]
    for (label, values), (marker, dash, width) in zip(series, styles, strict=True):
        if any(v is not None for v in values):
            ax.plot(
                turns,
                [v if v is not None else math.nan for v in values],
                marker=marker,
                linestyle=dash,
                linewidth=width,
                markersize=4 + width,
                alpha=0.8,
                label=label,
            )
    ax.set_xticks(turns)
    ax.set_ylim(-0.02, 1.05)
    ax.set_xlabel("turn")
    ax.set_ylabel("share of samples")
    ax.legend(fontsize=8)
    ax.set_title("Turn by turn")
    return _save(fig, path)


PLOT_FILES = {
    "speedup": "speedup_distribution.png",
    "fast_p": "fast_p.png",
    "groups": "levels.png",
    "turns": "turns.png",
}


def write_plots(
    records: Sequence[SampleRecord], summary: dict[str, Any], folder: Path
) -> tuple[dict[str, Path], dict[str, str]]:
    """({title: png} of the plots drawn, {file name: why not drawn}). A plot not drawn is also
    removed from ``folder``, so no stale picture outlives the numbers it showed."""
    folder.mkdir(parents=True, exist_ok=True)
    drawn: dict[str, Path] = {}
    skipped: dict[str, str] = {}
    if any(timed_speedups(records).values()):
        drawn["speedup distribution"] = speedup_distribution(
            records, folder / PLOT_FILES["speedup"]
        )
        drawn["fast_p over p"] = fast_p_curve(records, folder / PLOT_FILES["fast_p"])
    else:
        skipped[PLOT_FILES["speedup"]] = skipped[PLOT_FILES["fast_p"]] = NO_TIMINGS
    drawn[f"per {group_kind(summary)}"] = level_bars(summary, folder / PLOT_FILES["groups"])
    if summary["max_turns"] > 1:
        drawn["turn by turn"] = turn_progress(summary, folder / PLOT_FILES["turns"])
    else:
        skipped[PLOT_FILES["turns"]] = "one turn: nothing to show turn by turn"
    for name in skipped:
        (folder / name).unlink(missing_ok=True)
    return drawn, skipped
