"""Normalise task records: canonical source text, the KernelBench contract, metadata, prompt.

Only the AST is read here (``kernelrl.env.task``): nothing of a record is executed. Records
that are not KernelBench tasks are removed with the parser's message as the reason's detail.
"""

from __future__ import annotations

import json
from typing import Any

from datasets import Dataset
from rich.console import Console

from kernelrl.data.curate.report import StepReport, log_step, step_progress, timed
from kernelrl.data.schema import make_dataset, task_row
from kernelrl.env.backends import get_backend
from kernelrl.env.task import TaskError, task_from_source
from kernelrl.prompts import prompt_builders


def normalize_source(source: str) -> str:
    """LF line ends, no trailing spaces, no leading/trailing blank lines, one final newline."""
    lines = [line.rstrip() for line in source.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    return "\n".join(lines).strip("\n") + "\n"


def normalize_tasks(
    tasks: Dataset,
    backend: str | None = None,
    prompt_template: str | None = None,
    console: Console | None = None,
    one_shot: bool = True,
) -> tuple[Dataset, StepReport]:
    """Keep the records that are KernelBench tasks, in canonical form with a prompt.

    ``backend`` overrides each record's backend. Metadata given in the record (category,
    tolerances, size variants, level) wins over the task's ``KERNELRL`` literal. Repeated ids
    get a ``~N`` suffix so that ids stay unique keys.
    """
    report = StepReport("normalize", count_in=len(tasks))
    prompts = prompt_builders(prompt_template, one_shot=one_shot)
    rows: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    with timed(report), step_progress(console, "normalize", len(tasks)) as progress:
        for row in progress.track(tasks):
            record_id = row["id"]
            source = row.get("source")
            if not isinstance(source, str) or not source.strip():
                report.remove(record_id, "empty_source", "the record has no reference source")
                continue
            source = normalize_source(source)
            task_backend = backend or row.get("backend") or "triton"
            try:
                get_backend(task_backend)
            except ValueError as exc:
                report.remove(record_id, "bad_backend", str(exc))
                continue
            try:
                task = task_from_source(source, record_id, task_backend, row.get("level"))
            except TaskError as exc:
                reason = "syntax_error" if "does not parse" in str(exc) else "not_kernelbench"
                report.remove(record_id, reason, str(exc))
                continue
            out = task_row(
                task,
                origin=row.get("origin") or "",
                prompt=prompts[task_backend].first_messages(source),
            )
            if row.get("category") and row["category"] != "uncategorized":
                out["category"] = row["category"]
            for key in ("atol", "rtol"):
                if row.get(key) is not None:
                    out[key] = row[key]
            if row.get("sizes") and json.loads(row["sizes"]):
                out["sizes"] = row["sizes"]
            if record_id in seen:
                seen[record_id] += 1
                out["id"] = f"{record_id}~{seen[record_id]}"
                report.notes.setdefault("renamed_ids", []).append(out["id"])
            else:
                seen[record_id] = 1
            rows.append(out)
    result = make_dataset(rows, "tasks")
    report.count_out = len(result)
    log_step(report, console)
    return result, report
