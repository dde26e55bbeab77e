"""Console output for environment commands: one result, or a suite with a summary table."""

from __future__ import annotations

import statistics
import time
from collections import Counter
from concurrent.futures import as_completed

from rich.console import Console
from rich.table import Table

from kernelrl.env.result import EvalResult, Status
from kernelrl.env.task import Task
from kernelrl.progress import Progress


def print_result(result: EvalResult, console: Console) -> None:
    style = "green" if result.correct else "red"
    console.print(
        f"[bold]{result.task_id}[/bold] ({result.backend}, {result.device_name}): [{style}]{result.status}[/{style}]"
    )
    if result.checks_failed:
        console.print(f"checks failed: {', '.join(result.checks_failed)}")
    console.print(result.feedback, markup=False)


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else format(value, pattern)


def run_suite(
    pool, pairs: list[tuple[Task, str]], console: Console, repeats: int = 1
) -> list[EvalResult]:
    """Evaluate every (task, solution) pair through ``pool`` with a progress bar (plain lines
    when ``console`` is not a terminal), then a table."""
    tasks = [t for t, _ in pairs for _ in range(repeats)]
    solutions = [s for _, s in pairs for _ in range(repeats)]
    started = time.perf_counter()
    results: list[EvalResult | None] = [None] * len(tasks)
    with Progress(console) as progress:
        bar = progress.add_task("evaluating", total=len(tasks))
        futures = pool.submit(tasks, solutions)
        index_of = {id(f): i for i, f in enumerate(futures)}
        for future in as_completed(futures):
            results[index_of[id(future)]] = future.result()
            progress.advance(bar)
    elapsed = time.perf_counter() - started
    done = [r for r in results if r is not None]
    console.print(summary_table(done))
    counts = Counter(str(r.status) for r in done)
    rate = len(done) / elapsed * 60 if elapsed > 0 else 0.0
    console.print(
        f"{len(done)} evaluations in {elapsed:.1f} s ({rate:.1f}/min) on {pool.num_slots} slots; "
        + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
    )
    return done


def summary_table(results: list[EvalResult]) -> Table:
    """One row per task. Columns that are "-" for every task (timings on a CPU) are left out
    and named in the caption, so task names are not cut to fit an 80-column terminal."""
    columns = (
        "task",
        "status",
        "checks",
        "runtime ms",
        "vs eager",
        "vs compile",
        "own share",
        "eval s",
    )
    by_task: dict[str, list[EvalResult]] = {}
    for result in results:
        by_task.setdefault(result.task_id, []).append(result)
    rows = []
    for task_id, runs in by_task.items():
        last = runs[-1]
        speedups = [r.speedup_vs_eager for r in runs if r.speedup_vs_eager is not None]
        style = "green" if all(r.status is Status.CORRECT for r in runs) else "red"
        rows.append(
            (
                task_id,
                f"[{style}]{last.status}[/{style}]" + (f" x{len(runs)}" if len(runs) > 1 else ""),
                ", ".join(last.checks_failed) or "-",
                _fmt(
                    last.runtime.median_ms if last.runtime and last.timing_meaningful else None,
                    ".4f",
                ),
                _fmt(statistics.median(speedups) if speedups else None, ".2f"),
                _fmt(last.speedup_vs_compile, ".2f"),
                _fmt(last.own_kernel_share, ".0%"),
                _fmt(last.phase_seconds.get("total"), ".1f"),
            )
        )
    keep = [i for i, name in enumerate(columns) if i < 2 or any(r[i] != "-" for r in rows)]
    dropped = [name for i, name in enumerate(columns) if i not in keep]
    table = Table(
        title="kernelrl env check-suite",
        caption=f"not shown, '-' for every task: {', '.join(dropped)}" if dropped else None,
    )
    for i in keep:
        name = columns[i]
        table.add_column(
            name,
            justify="right" if name not in ("task", "status", "checks") else "left",
            no_wrap=name in ("task", "status"),
        )
    for row in rows:
        table.add_row(*(row[i] for i in keep))
    return table
