"""A sweep's report: ``summary.json`` (every number), ``report.md`` (tables), ``plots/``.

The summary is built from the results folder alone (``summary``), so a report can be rebuilt
long after the sweep ran; this module renders it, as Markdown and on the console. Rates are over
every selected task: the tasks that were not evaluated are counted as failed and listed with
their reason; harness errors get a line of their own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kernelrl.eval.metrics import FAST_P
from kernelrl.eval.records import write_atomic
from kernelrl.eval.summary import build_summary

HARNESS_NOTE = "not the solution's fault; rerun"
_DIGITS = re.compile(r"(\d+)")


# ---------------------------------------------------------------------------------- formatting
def fmt_rate(estimate: dict[str, Any] | None, counts: bool = True) -> str:
    if not estimate or estimate.get("value") is None:
        return "n/a"
    text = f"{estimate['value']:.1%}"
    if estimate.get("low") is not None and estimate.get("high") is not None:
        text += f" [{estimate['low']:.1%}, {estimate['high']:.1%}]"
    if counts and estimate.get("count") is not None:
        text += f" ({estimate['count']}/{estimate['n']})"
    return text


def fmt_speedup(estimate: dict[str, Any] | None) -> str:
    if not estimate or estimate.get("value") is None:
        return "n/a"
    text = f"{estimate['value']:.2f}x"
    if estimate.get("low") is not None and estimate.get("high") is not None:
        text += f" [{estimate['low']:.2f}, {estimate['high']:.2f}]"
    return text + f" (n={estimate['n']})"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def fmt_pass(estimate: dict[str, Any] | None) -> str:
    if not estimate or estimate.get("value") is None:
        return "n/a"
    text = f"{estimate['value']:.1%}"
    if estimate.get("low") is not None:
        text += f" [{estimate['low']:.1%}, {estimate['high']:.1%}]"
    return text + f" ({plural(estimate['n'], 'task')})"


def natural_key(text: str) -> list[Any]:
    """Sort key that orders numbers by value: ``10_x`` before ``100_x``, ``level2`` before
    ``level10``."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in _DIGITS.split(text)]


def _num(value: float | None, pattern: str = ".2f", suffix: str = "x") -> str:
    return "-" if value is None else f"{value:{pattern}}{suffix}"


def headline_rows(overall: dict[str, Any]) -> list[tuple[str, str]]:
    """(metric, formatted value) rows of one view's overall summary."""
    rows = [
        ("parse rate", fmt_rate(overall["parse_rate"])),
        ("compile rate", fmt_rate(overall["compile_rate"])),
        ("correct", fmt_rate(overall["correct_rate"])),
        ("integrity violations", fmt_rate(overall["integrity_rate"])),
    ]
    for baseline in ("eager", "compile"):
        for p in FAST_P:
            rows.append(
                (f"fast_{p:g} vs {baseline}", fmt_rate(overall["fast_p"][baseline][f"{p:g}"]))
            )
    for baseline in ("eager", "compile"):
        rows.append(
            (
                f"geomean speedup vs {baseline} (correct)",
                fmt_speedup(overall["geomean_speedup"][baseline]),
            )
        )
    for k, estimate in overall["pass_at_k"].items():
        rows.append((f"pass@{k}", fmt_pass(estimate)))
    rows.append(
        (
            "not evaluated (counted as failed)",
            f"{len(overall['not_evaluated'])} of {plural(overall['tasks'], 'task')}",
        )
    )
    rows.append(("harness errors", f"{overall['harness_errors']} ({HARNESS_NOTE})"))
    return rows


def _group_table(groups: dict[str, dict[str, Any]], label: str) -> str:
    rows = [
        (
            name,
            s["tasks"],
            fmt_rate(s["compile_rate"], counts=False),
            fmt_rate(s["correct_rate"]),
            fmt_rate(s["fast_p"]["eager"]["1"], counts=False),
            fmt_rate(s["fast_p"]["compile"]["1"], counts=False),
            fmt_speedup(s["geomean_speedup"]["eager"]),
            fmt_pass(s["pass_at_k"].get("1")),
        )
        for name, s in groups.items()
    ]
    header = [label, "tasks", "compiled", "correct", "fast_1 eager", "fast_1 compile"]
    return _table(header + ["geomean vs eager", "pass@1"], rows)


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def setting_rows(run: dict[str, Any], max_turns: int) -> list[tuple[str, str]]:
    """The report's settings table. Fixed solutions are replayed, not sampled: samples per task
    is what the sources hold (a range where tasks differ) and no sampling setting applies."""
    fixed = run["client"] == "fixed"
    who = run["model"] or ", ".join(run["fixed_solutions"]) or "?"
    low, high = run.get("samples_range") or (run["samples"], run["samples"])
    samples = str(low) if low == high else f"{low}-{high}"
    if fixed:
        samples += " (what the fixed solutions hold)"
    turns = f"{run['turns']} planned, {max_turns} made" if run["turns"] != max_turns else max_turns
    rows = [
        ("generation", f"{run['client']}: {who}"),
        ("benchmark", f"{run['benchmark']} {run['benchmark_path']}".strip()),
        ("backend", run["backend"]),
        ("tasks / attempts", f"{run['tasks']} / {run['attempts']}"),
        ("samples per task, turns", f"{samples}, {turns}"),
        (
            ("temperature, max tokens", f"{run['temperature']}, {run['max_tokens']}")
            if not fixed
            else ("temperature, max tokens", "n/a: fixed completions are replayed, not sampled")
        ),
        ("evaluated on", ", ".join(f"{k} ({v})" for k, v in run["devices"].items())),
        ("versions", ", ".join(f"{k} {v}" for k, v in sorted(run["versions"].items()))),
        ("report written", run["generated_at"]),
    ]
    return rows


def markdown(
    summary: dict[str, Any],
    plots: dict[str, Path] | None = None,
    folder: Path | None = None,
    skipped_plots: dict[str, str] | None = None,
) -> str:
    """The report, section by section: each section is a function of the summary alone, so a
    report rebuilt from ``summary.json`` is the one the sweep wrote."""
    run = summary["run"]
    multi_turn = summary["max_turns"] > 1
    view_name = "best turn" if multi_turn else "all attempts"
    view = summary["views"]["best" if multi_turn else "last"]
    out = [f"# Evaluation sweep: {run['run_name']}", ""]
    out += [_table(["setting", "value"], setting_rows(run, summary["max_turns"])), ""]
    if not run["timing_meaningful"]:
        out += [
            "> Timings are not meaningful on this device (CPU, Triton interpreter): fast_p for "
            "p > 0 and speedups are n/a; fast_0 is the correctness rate.",
            "",
        ]
    out += _headline_section(summary, multi_turn)
    out += selection_lines(summary)
    out += _group_sections(view, view_name)
    if multi_turn:
        out += _turn_section(summary)
    out += _outcome_section(summary, multi_turn)
    out += _generation_section(summary["generation"])
    out += _task_section(view, view_name, multi_turn)
    out += _plot_section(plots, folder, skipped_plots)
    return "\n".join(out)


_RATES_NOTE = (
    "Rates are over attempts (tasks x samples) of every selected task with Wilson "
    "intervals: a task that was not evaluated counts as failed (its planned samples, at "
    "least one). pass@k uses the unbiased estimator over every selected task with a "
    "percentile bootstrap over tasks; where every task scores exactly 0 or 1 (k samples of "
    "k, or nothing solved) a bootstrap could only return the estimate itself, so the "
    "interval is Wilson's over tasks, and where every task has the same fractional pass@k "
    "(one task, say) no interval is shown; speedups are geometric means over correct attempts with a "
    "bootstrap interval. fast_p = correct and speedup > p. Harness errors are left out of "
    "every rate."
)


def _headline_section(summary: dict[str, Any], multi_turn: bool) -> list[str]:
    """The headline metrics (last and best turn side by side when there are several turns)
    and how every rate is counted."""
    views = summary["views"]
    head_last = headline_rows(views["last"]["overall"])
    head_best = headline_rows(views["best"]["overall"])
    out = ["## Headline", ""]
    if multi_turn:
        rows = [(m, a, b) for (m, a), (_, b) in zip(head_last, head_best, strict=True)]
        out += [_table(["metric", "last turn", "best turn"], rows), ""]
    else:
        out += [_table(["metric", "value"], head_last), ""]
    return out + [_RATES_NOTE, ""]


def _group_sections(view: dict[str, Any], view_name: str) -> list[str]:
    """Per level and per category tables, where the tasks have them."""
    out: list[str] = []
    if view["levels"]:
        out += [f"## Per level ({view_name})", "", _group_table(view["levels"], "level"), ""]
    if view["categories"]:
        out += [
            f"## Per category ({view_name})",
            "",
            _group_table(view["categories"], "category"),
            "",
        ]
    return out


def _turn_section(summary: dict[str, Any]) -> list[str]:
    """What each further turn adds: the rates at each turn and of the best turn so far."""
    rows = [
        (
            p["turn"] + 1,
            p["attempts"],
            fmt_rate(p["correct_at_turn"]),
            fmt_rate(p["best_so_far"]["compile_rate"], counts=False),
            fmt_rate(p["best_so_far"]["correct_rate"]),
            fmt_rate(p["best_so_far"]["fast_p"]["eager"]["1"], counts=False),
            fmt_speedup(p["best_so_far"]["geomean_speedup"]["eager"]),
        )
        for p in summary["turns"]
    ]
    header = [
        "turn",
        "attempts",
        "correct at turn",
        "compiled (best so far)",
        "correct (best so far)",
        "fast_1 eager (best so far)",
        "geomean vs eager (best so far)",
    ]
    return ["## Turn by turn", "", _table(header, rows), ""]


def _outcome_section(summary: dict[str, Any], multi_turn: bool) -> list[str]:
    """The status of every attempt (per turn when there are several), then the first error
    of each kind, so a failure mode can be read without opening the records."""
    out = ["## Outcomes of every attempt", ""]
    table = summary["outcomes"]
    total = sum(c.get("all", 0) for c in table.values()) or 1
    turns = [str(t + 1) for t in range(summary["max_turns"])]
    if multi_turn:
        rows = [
            (k, *(c.get(t, 0) for t in turns), c["all"], f"{c['all'] / total:.1%}")
            for k, c in table.items()
        ]
        out += [_table(["status", *(f"turn {t}" for t in turns), "all", "share"], rows), ""]
    else:
        rows = [(k, c["all"], f"{c['all'] / total:.1%}") for k, c in table.items()]
        out += [_table(["status", "attempts", "share"], rows), ""]
    examples = summary.get("examples") or {}
    if examples:
        out += ["First error of each kind:", ""]
        for status, example in examples.items():
            where = f"{example['task_id']} sample {example['sample']} turn {example['turn'] + 1}"
            out.append(f"- `{status}` ({where}): {example['error']}")
        out.append("")
    return out


def _generation_section(generation: dict[str, Any]) -> list[str]:
    """Token counts and finish reasons (absent for replayed fixed solutions, which have none);
    truncation gets a line because it explains many parse failures."""
    if generation["mean_completion_tokens"] is None:
        return []
    reasons = ", ".join(f"{k} {v}" for k, v in generation["finish_reasons"].items())
    rows = [
        ("finish reasons", reasons),
        (
            "completion tokens (mean / max)",
            f"{generation['mean_completion_tokens']:.0f} / {generation['max_completion_tokens']}",
        ),
        (
            "prompt tokens (mean / max)",
            f"{generation['mean_prompt_tokens']:.0f} / {generation['max_prompt_tokens']}",
        ),
        (
            "generation seconds per attempt (mean)",
            _num(generation["mean_generation_s"], ".2f", " s"),
        ),
    ]
    out = ["## Generation", "", _table(["", "value"], rows), ""]
    if generation["truncated"]:
        out += [
            f"{generation['truncated']} of {generation['attempts']} completions stopped at "
            "max_tokens (finish reason `length`); a truncated answer usually has no complete "
            "code block.",
            "",
        ]
    return out


def _task_section(view: dict[str, Any], view_name: str, multi_turn: bool) -> list[str]:
    """One row per task in natural order, its statuses or why it was not evaluated."""
    rows = [
        (
            t["task_id"],
            "-" if t["level"] is None else t["level"],
            f"{t['correct']}/{t['samples']}",
            _num(t["best_speedup_vs_eager"]),
            _num(t["best_speedup_vs_compile"]),
            ", ".join(f"{k} {v}" for k, v in t["statuses"].items())
            or f"not evaluated: {t['not_evaluated']}",
        )
        + ((("-" if t["best_turn"] is None else t["best_turn"] + 1),) if multi_turn else ())
        for t in sorted(view["tasks"], key=lambda t: natural_key(t["task_id"]))
    ]
    header = ["task", "level", "correct", "best vs eager", "best vs compile", "statuses"]
    header += ["first correct turn"] if multi_turn else []
    return [f"## Per task ({view_name})", "", _table(header, rows), ""]


def _plot_section(
    plots: dict[str, Path] | None, folder: Path | None, skipped_plots: dict[str, str] | None
) -> list[str]:
    """The plots, linked relative to the report, and why any were not drawn."""
    if not (plots or skipped_plots):
        return []
    out = ["## Plots", ""]
    for title, path in (plots or {}).items():
        target = path.relative_to(folder) if folder else path
        out += [f"![{title}]({target.as_posix()})", ""]
    for name, why in (skipped_plots or {}).items():
        out += [f"- `plots/{name}` not drawn: {why}.", ""]
    return out


def selection_lines(summary: dict[str, Any], limit: int | None = None) -> list[str]:
    """Markdown: the tasks counted as failed without an evaluation, and the harness errors."""
    selection = summary["selection"]
    missing = selection["not_evaluated"]
    out = [
        f"Selected tasks: {selection['tasks']}; evaluated: {selection['tasks'] - len(missing)}; "
        f"not evaluated (counted as failed): {len(missing)}.",
        "",
    ]
    if selection["harness_errors"]:
        tasks = selection["harness_error_tasks"]
        out += [
            f"**harness errors: {selection['harness_errors']}** ({HARNESS_NOTE}): left out of "
            f"every rate; tasks: {', '.join(tasks[:limit] if limit else tasks)}"
            + (" ..." if limit and len(tasks) > limit else ""),
            "",
        ]
    if missing:
        out += ["## Not evaluated (counted as failed)", ""]
        missing = sorted(missing, key=lambda t: natural_key(t["task_id"]))
        shown = missing[:limit] if limit else missing
        rows = [
            (t["task_id"], "-" if t["level"] is None else t["level"], t["reason"]) for t in shown
        ]
        out += [_table(["task", "level", "reason"], rows), ""]
        if len(shown) < len(missing):
            out += [f"... and {len(missing) - len(shown)} more (summary.json lists all)", ""]
    return out


def write_report(folder: str | Path, plots: bool = True) -> dict[str, Any]:
    """(Re)build summary.json, report.md and the plots of a results folder; returns the summary."""
    folder = Path(folder)
    summary, records, _ = build_summary(folder)
    # Atomic: a full disk leaves the previous summary and report, never empty files.
    write_atomic(folder / "summary.json", json.dumps(summary, indent=2, sort_keys=True) + "\n")
    plot_paths: dict[str, Path] = {}
    skipped: dict[str, str] = {}
    if plots and records:
        from kernelrl.eval.plots import write_plots

        plot_paths, skipped = write_plots(records, summary, folder / "plots")
    write_atomic(folder / "report.md", markdown(summary, plot_paths, folder, skipped))
    return summary


def console_table(summary: dict[str, Any]) -> Table:
    multi_turn = summary["max_turns"] > 1
    table = Table(title=f"kernelrl eval: {summary['run']['run_name']}")
    table.add_column("metric")
    if multi_turn:
        table.add_column("last turn", justify="right")
        table.add_column("best turn", justify="right")
        last = headline_rows(summary["views"]["last"]["overall"])
        best = headline_rows(summary["views"]["best"]["overall"])
        for (metric, a), (_, b) in zip(last, best, strict=True):
            table.add_row(metric, a, b)
    else:
        table.add_column("value", justify="right")
        for metric, value in headline_rows(summary["views"]["last"]["overall"]):
            table.add_row(metric, value)
    return table


def print_summary(summary: dict[str, Any], console: Console, limit: int = 20) -> None:
    """The headline table, then the tasks counted as failed unevaluated and the harness errors."""
    console.print(console_table(summary))
    selection = summary["selection"]
    missing = selection["not_evaluated"]
    if missing:
        console.print(
            f"[yellow]{len(missing)} of {selection['tasks']} tasks not evaluated, counted as "
            "failed[/yellow]:",
            soft_wrap=True,
        )
        for row in missing[:limit]:
            console.print(f"  {row['task_id']}: {row['reason']}", soft_wrap=True, markup=False)
        if len(missing) > limit:
            console.print(f"  ... and {len(missing) - limit} more (summary.json lists all)")
    if selection["harness_errors"]:
        console.print(
            f"[red]harness errors: {selection['harness_errors']}[/red] ({HARNESS_NOTE}); tasks: "
            + escape(", ".join(selection["harness_error_tasks"][:limit])),
            soft_wrap=True,
        )
