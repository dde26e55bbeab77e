"""Reference Triton solutions as SFT records, each judged ``correct`` by the environment first.

The candidates are written from the task's graph (``triton_ref``), evaluated through an
environment pool (the real evaluator: static integrity checks, the sandboxed run, the
comparison with the reference), turned into SFT rows by curation's own ``samples_to_sft`` and
filtered by its ``select_sft``, which drops anything not ``correct`` or with a failed check.
No candidate reaches the SFT set on the strength of having been generated.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from datasets import Dataset
from rich.console import Console

from kernelrl.data.curate.report import StepReport, timed
from kernelrl.data.curate.sft_select import (
    SelectConfig,
    evaluate_missing,
    samples_to_sft,
    select_sft,
)
from kernelrl.data.schema import make_dataset
from kernelrl.data.synth.graph import Graph
from kernelrl.data.synth.layout_ref import explain_for, solution_for
from kernelrl.env.pools import Pool

ORIGIN = "synthetic_reference"


def pick_candidates(
    ids: Sequence[str], families: Sequence[str], count: int, seed: int
) -> list[str]:
    """``count`` task ids, seeded, taken from each family in turn (balanced families)."""
    by_family: dict[str, list[str]] = defaultdict(list)
    for task_id, family in zip(ids, families, strict=True):
        by_family[family].append(task_id)
    rng = random.Random(seed)
    queues = []
    for family in sorted(by_family):
        members = list(by_family[family])
        rng.shuffle(members)
        queues.append(members)
    picked: list[str] = []
    while len(picked) < count and any(queues):
        for queue in queues:
            if queue and len(picked) < count:
                picked.append(queue.pop())
    return picked


def completion_for(graph: Graph) -> str:
    """The candidate's completion: concise reasoning, then the solution in a code block."""
    return f"<think>\n{explain_for(graph)}\n</think>\n\n```python\n{solution_for(graph)}```\n"


def reference_sft(
    tasks: Dataset,
    graphs: dict[str, Graph],
    pool: Pool,
    select: SelectConfig,
    console: Console | None = None,
) -> tuple[Dataset, Dataset, list[StepReport]]:
    """(evaluated samples, selected SFT rows, reports) for every task of ``tasks``."""
    report = StepReport("reference_solutions", count_in=len(tasks))
    samples = make_dataset(
        [
            {
                "id": f"{row['id']}~ref",
                "task_id": row["id"],
                "prompt": row["prompt"],
                "completion": completion_for(graphs[row["id"]]),
                "origin": ORIGIN,
            }
            for row in tasks
        ],
        "samples",
    )
    with timed(report):
        samples, evaluated = evaluate_missing(samples, tasks, pool, console)
    statuses: dict[str, int] = defaultdict(int)
    for row in samples:
        statuses[_status(row["result"])] += 1
    report.count_out = statuses.get("correct", 0)
    report.notes.update(evaluated=evaluated, statuses=dict(statuses))
    sft, selected = select_sft(
        samples_to_sft(samples, tasks, select.sft_reasoning_format), select, console
    )
    return samples, sft, [report, selected]


def _status(result: Any) -> str:
    return json.loads(result)["status"] if result else "not_evaluated"
