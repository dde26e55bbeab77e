"""``kernelrl eval compare RUN_A RUN_B``: two sweeps side by side.

Headline metrics of both runs with the difference, then the tasks where they disagree (solved
by one and not the other) and, for tasks both solve, the geometric mean of B's speedup over
A's. Both runs are summarised with the same statistics settings (A's), so intervals and pass@k
mean the same thing on both sides.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kernelrl.eval.metrics import FAST_P, best_view, last_view, speedup, sweep_summary
from kernelrl.eval.records import SampleRecord
from kernelrl.eval.report import _table
from kernelrl.eval.summary import load_run, load_selection, run_metadata, stats_config


def _value(estimate: dict[str, Any] | None) -> float | None:
    return None if not estimate else estimate.get("value")


def _metric_rows(
    a: dict[str, Any], b: dict[str, Any]
) -> list[tuple[str, float | None, float | None, str]]:
    """(metric, A, B, kind) for the headline metrics of two overall summaries."""
    rows: list[tuple[str, float | None, float | None, str]] = []
    for key, label in (
        ("parse_rate", "parse rate"),
        ("compile_rate", "compile rate"),
        ("correct_rate", "correct"),
        ("integrity_rate", "integrity violations"),
    ):
        rows.append((label, _value(a[key]), _value(b[key]), "rate"))
    for baseline in ("eager", "compile"):
        for p in FAST_P:
            key = f"{p:g}"
            rows.append(
                (
                    f"fast_{key} vs {baseline}",
                    _value(a["fast_p"][baseline][key]),
                    _value(b["fast_p"][baseline][key]),
                    "rate",
                )
            )
    for baseline in ("eager", "compile"):
        rows.append(
            (
                f"geomean speedup vs {baseline}",
                _value(a["geomean_speedup"][baseline]),
                _value(b["geomean_speedup"][baseline]),
                "speedup",
            )
        )
    for k in sorted(set(a["pass_at_k"]) | set(b["pass_at_k"]), key=int):
        rows.append(
            (f"pass@{k}", _value(a["pass_at_k"].get(k)), _value(b["pass_at_k"].get(k)), "rate")
        )
    return rows


def _fmt(value: float | None, kind: str) -> str:
    if value is None:
        return "n/a"
    return f"{value:.1%}" if kind == "rate" else f"{value:.2f}x"


def _delta(a: float | None, b: float | None, kind: str) -> str:
    if a is None or b is None:
        return "-"
    if kind == "rate":
        return f"{(b - a) * 100:+.1f} pt"
    return f"{b / a:.2f}x" if a > 0 else "-"


def _solved(view: list[SampleRecord]) -> dict[str, list[SampleRecord]]:
    solved: dict[str, list[SampleRecord]] = {}
    for record in view:
        solved.setdefault(record.task_id, [])
        if record.result.correct:
            solved[record.task_id].append(record)
    return solved


def _best_speedup(records: list[SampleRecord]) -> float | None:
    values = [s for r in records if (s := speedup(r.result, "eager")) is not None]
    return max(values) if values else None


# Settings that say where a run lives, not what it measured.
_NOT_SETTINGS = {"output_dir", "run_name", "overwrite", "plots", "report_to"}


def setting_differences(config_a: dict[str, Any], config_b: dict[str, Any]) -> list[list[Any]]:
    """[key, A's value, B's value] for every recipe setting the two runs do not share."""
    keys = sorted((set(config_a) | set(config_b)) - _NOT_SETTINGS)
    return [
        [key, config_a.get(key), config_b.get(key)]
        for key in keys
        if config_a.get(key) != config_b.get(key)
    ]


def column_labels(meta_a: dict[str, Any], meta_b: dict[str, Any]) -> tuple[str, str]:
    """Names for the A and B columns that tell the runs apart: the run names, else the
    folders' names, else their paths."""
    for key in ("run_name", "folder_name", "folder"):
        a, b = meta_a.get(key) or "", meta_b.get(key) or ""
        if a and b and a != b:
            return f"A: {a}", f"B: {b}"
    return "A", "B"


def compare_runs(folder_a: str | Path, folder_b: str | Path, view: str = "best") -> dict[str, Any]:
    config_a, records_a = load_run(folder_a)
    config_b, records_b = load_run(folder_b)
    selection_a, selection_b = load_selection(folder_a), load_selection(folder_b)
    stats = stats_config(config_a)
    summary_a = sweep_summary(records_a, stats, selection_a)
    summary_b = sweep_summary(records_b, stats, selection_b)
    meta_a = run_metadata(config_a, records_a, Path(folder_a), selection_a)
    meta_b = run_metadata(config_b, records_b, Path(folder_b), selection_b)
    meta_a["folder_name"], meta_b["folder_name"] = Path(folder_a).name, Path(folder_b).name
    meta_a["folder"], meta_b["folder"] = str(Path(folder_a)), str(Path(folder_b))
    pick = best_view if view == "best" else last_view
    solved_a, solved_b = _solved(pick(records_a)), _solved(pick(records_b))
    common = sorted(set(solved_a) & set(solved_b))
    only_a = [t for t in common if solved_a[t] and not solved_b[t]]
    only_b = [t for t in common if solved_b[t] and not solved_a[t]]
    ratios = []
    for task in common:
        sa, sb = _best_speedup(solved_a[task]), _best_speedup(solved_b[task])
        if sa and sb:
            ratios.append((task, sb / sa))
    label_a, label_b = column_labels(meta_a, meta_b)
    return {
        "a": meta_a,
        "b": meta_b,
        "labels": [label_a, label_b],
        "settings_differ": setting_differences(config_a, config_b),
        "view": view,
        "rows": _metric_rows(
            summary_a["views"][view]["overall"], summary_b["views"][view]["overall"]
        ),
        "tasks_common": len(common),
        "tasks_only_in_a": sorted(set(solved_a) - set(solved_b)),
        "tasks_only_in_b": sorted(set(solved_b) - set(solved_a)),
        "solved_only_by_a": only_a,
        "solved_only_by_b": only_b,
        "speedup_ratios": ratios,
        "geomean_ratio": (
            math.exp(sum(math.log(r) for _, r in ratios) / len(ratios)) if ratios else None
        ),
    }


def _short(value: Any, width: int = 60) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= width else text[: width - 3] + "..."


def compare_markdown(comparison: dict[str, Any]) -> str:
    a, b = comparison["a"], comparison["b"]
    label_a, label_b = comparison["labels"]
    view = "best turn" if comparison["view"] == "best" else "last turn"
    out = [f"# {label_a} vs {label_b}, {view}", ""]
    out += [
        _table(
            ["", label_a, label_b],
            [
                ("folder", a["folder"], b["folder"]),
                (
                    "generation",
                    f"{a['client']}: {a['model'] or ', '.join(a['fixed_solutions'])}",
                    f"{b['client']}: {b['model'] or ', '.join(b['fixed_solutions'])}",
                ),
                ("benchmark", a["benchmark"], b["benchmark"]),
                ("backend", a["backend"], b["backend"]),
                (
                    "tasks / attempts",
                    f"{a['tasks']} / {a['attempts']}",
                    f"{b['tasks']} / {b['attempts']}",
                ),
                ("devices", ", ".join(a["devices"]), ", ".join(b["devices"])),
            ],
        ),
        "",
    ]
    out += settings_lines(comparison)
    rows = [(m, _fmt(x, k), _fmt(y, k), _delta(x, y, k)) for m, x, y, k in comparison["rows"]]
    out += [_table(["metric", label_a, label_b, "B - A"], rows), ""]
    out += [f"Tasks in both runs: {comparison['tasks_common']}."]
    for key, label in (
        ("solved_only_by_a", "Solved by A only"),
        ("solved_only_by_b", "Solved by B only"),
        ("tasks_only_in_a", "Tasks only in A"),
        ("tasks_only_in_b", "Tasks only in B"),
    ):
        names = comparison[key]
        if names:
            out.append(
                f"{label} ({len(names)}): {', '.join(names[:30])}"
                + (" ..." if len(names) > 30 else "")
            )
    if comparison["geomean_ratio"] is not None:
        out.append(
            f"Tasks both solve with timings: {len(comparison['speedup_ratios'])}; geometric mean of "
            f"B's best speedup over A's: {comparison['geomean_ratio']:.2f}x."
        )
    return "\n".join(out) + "\n"


def settings_lines(comparison: dict[str, Any]) -> list[str]:
    """Markdown: the recipe settings that differ between the runs (or that none does)."""
    differ = comparison["settings_differ"]
    if not differ:
        return ["Settings: identical (apart from where and how the results are written).", ""]
    label_a, label_b = comparison["labels"]
    rows = [(key, _short(x), _short(y)) for key, x, y in differ]
    return ["Settings that differ:", "", _table(["setting", label_a, label_b], rows), ""]


def compare_table(comparison: dict[str, Any]) -> Table:
    label_a, label_b = comparison["labels"]
    table = Table(title=f"{label_a} vs {label_b}")
    for column in ("metric", label_a, label_b, "B - A"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    for metric, x, y, kind in comparison["rows"]:
        table.add_row(metric, _fmt(x, kind), _fmt(y, kind), _delta(x, y, kind))
    return table


def print_comparison(comparison: dict[str, Any], console: Console) -> None:
    label_a, label_b = comparison["labels"]
    differ = comparison["settings_differ"]
    if differ:
        settings = Table(title="settings that differ")
        for column in ("setting", label_a, label_b):
            settings.add_column(column)
        for key, x, y in differ:
            settings.add_row(key, _short(x, 40), _short(y, 40))
        console.print(settings)
    else:
        console.print("settings: identical (apart from where and how the results are written)")
    console.print(compare_table(comparison))
    for line in compare_markdown(comparison).splitlines():
        if line.startswith(("Solved by", "Tasks only", "Tasks both", "Tasks in both")):
            console.print(line, markup=False)
