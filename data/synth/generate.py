"""Drawing tasks: graphs from one seeded stream, exact duplicates skipped, each checked.

One ``random.Random(seed)`` draws every graph in turn, so a seed gives the same tasks in the
same order on any machine. A graph equal to an earlier one (same operators, parameters, dtype
and global sizes: ``Graph.key``) is skipped before it is rendered; a rendered task that fails the
in-process check (``check``) is dropped with its reason. Drawing stops at ``num_tasks`` sound
tasks or after ``num_tasks * max_attempts_factor`` graphs.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from rich.console import Console

from kernelrl.data.curate.report import StepReport, log_step, step_progress, timed
from kernelrl.data.synth.check import check_task
from kernelrl.data.synth.config import SynthConfig
from kernelrl.data.synth.graph import draw
from kernelrl.data.synth.render import render_task
from kernelrl.data.synth.tolerance import measured_tolerances


def task_id(seed: int, index: int) -> str:
    return f"synth{seed}_{index:06d}"


def generate_tasks(
    config: SynthConfig, console: Console | None = None
) -> tuple[list[dict[str, Any]], StepReport]:
    """Raw task records (``id``, ``source``, ``backend``, ``graph``) and the step's report."""
    report = StepReport("generate")
    rng = random.Random(config.seed)
    draw_config = config.draw_config()
    seen: set[str] = set()
    rows: list[dict[str, Any]] = []
    failures: Counter[str] = Counter()
    duplicates = attempts = widened = 0
    limit = int(config.num_tasks * config.max_attempts_factor)
    with timed(report), step_progress(console, "generate", config.num_tasks) as progress:
        while len(rows) < config.num_tasks and attempts < limit:
            attempts += 1
            graph = draw(rng, draw_config)
            key = graph.key(config.size_profile)
            if key in seen:
                duplicates += 1
                continue
            seen.add(key)
            source = render_task(graph, config.size_profile)
            problem = check_task(graph, source, config.size_profile)
            if problem is not None:
                failures[problem.split(":")[0]] += 1
                report.remove(f"draw_{attempts}", "check_failed", f"{graph.combination}: {problem}")
                continue
            measured = measured_tolerances(graph, source)
            if measured is not None:
                widened += 1
                source = render_task(graph, config.size_profile, measured)
            rows.append(
                {
                    "id": task_id(config.seed, len(rows)),
                    "source": source,
                    "backend": config.backend,
                    "origin": f"synthetic:seed={config.seed}",
                    "graph": graph,
                }
            )
            progress.advance()
    report.count_in, report.count_out = attempts, len(rows)
    report.notes.update(
        drawn=attempts,
        duplicates_skipped=duplicates,
        check_failures=dict(failures),
        tolerances_widened=widened,
    )
    log_step(report, console)
    return rows, report
