"""SFT curation from generated samples: measured, correct, honest, fast, concise, balanced.

1. ``attach_to_tasks``: keep samples of tasks that survived curation (a sample of a removed
   task, e.g. a contaminated one, must not reach training either).
2. ``evaluate_missing``: samples without an ``EvalResult`` are measured through the pool.
3. ``samples_to_sft``: completion -> reasoning + solution + the measured result, as SFT rows.
4. ``select_sft``: keep correct solutions with no failed integrity check and, where timings
   mean something (a GPU), a speedup over the threshold; drop reasoning above a length cap;
   one copy of identical solutions per task; then per task and kind, rank by reasoning length
   (shortest first: ConCuR found concise reasoning traces give better kernels) and speedup,
   and keep at most ``sft_cap_per_task`` (task balance, also from ConCuR).
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from datasets import Dataset
from rich.console import Console

from kernelrl.data.curate.report import StepReport, log_step, step_progress, timed
from kernelrl.data.curate.tokens import normalized_tokens
from kernelrl.data.schema import make_dataset, result_columns, result_of
from kernelrl.env.parse import FormatError, extract_solution
from kernelrl.env.pools import Pool
from kernelrl.env.result import EvalResult
from kernelrl.env.task import task_from_row

_TOKEN = re.compile(r"\w+|[^\w\s]")
_THINK = re.compile(r"<think>(.*?)</think>", re.S | re.I)
_FENCE = re.compile(r"^[ \t]{0,3}(`{3,}|~{3,})", re.M)


def count_tokens(text: str | None) -> int:
    """A tokenizer-free length: words and punctuation marks (stable across models)."""
    return len(_TOKEN.findall(text or ""))


def split_completion(completion: str) -> tuple[str, str | None]:
    """(reasoning, solution source or None). Reasoning is the ``<think>`` text when present,
    otherwise the prose before the first code block."""
    try:
        solution: str | None = extract_solution(completion)
    except FormatError:
        solution = None
    thoughts = _THINK.findall(completion)
    if thoughts:
        reasoning = "\n\n".join(t.strip() for t in thoughts)
    else:
        fence = _FENCE.search(completion)
        reasoning = (completion[: fence.start()] if fence else completion).strip()
    return reasoning, solution


def format_completion(reasoning: str, solution: str, reasoning_format: str = "think") -> str:
    """The assistant text to learn: reasoning (as ``<think>`` or plain prose) then the code."""
    code = f"```python\n{solution.rstrip()}\n```"
    if reasoning_format == "none" or not reasoning.strip():
        return code
    if reasoning_format == "think":
        return f"<think>\n{reasoning.strip()}\n</think>\n\n{code}"
    if reasoning_format == "plain":
        return f"{reasoning.strip()}\n\n{code}"
    raise ValueError(f"reasoning_format must be think, plain or none, got {reasoning_format!r}")


# ---------------------------------------------------------------------- 1-2: tasks, results
def attach_to_tasks(
    records: Dataset, tasks: Dataset, step_name: str = "attach", console: Console | None = None
) -> tuple[Dataset, StepReport]:
    """Keep records (samples or trajectories) whose ``task_id`` is a curated task."""
    report = StepReport(step_name, count_in=len(records))
    known = set(tasks["id"]) if len(tasks) else set()
    keep = []
    with timed(report):
        for index, row in enumerate(records):
            if row["task_id"] in known:
                keep.append(index)
            else:
                report.remove(
                    row["id"],
                    "task_removed",
                    f"task {row['task_id']} is not in the curated task set",
                )
    result = records.select(keep)
    report.count_out = len(result)
    log_step(report, console)
    return result, report


def fill_prompts(records: Dataset, tasks: Dataset, kind: str) -> Dataset:
    """Records without their own prompt get their task's prompt (what the model was asked)."""
    prompts = {row["id"]: row["prompt"] for row in tasks}
    rows = [{**row, "prompt": row["prompt"] or prompts.get(row["task_id"])} for row in records]
    return make_dataset(rows, kind)


def _evaluate(
    pool: Pool,
    tasks: list[Any],
    solutions: list[str],
    console: Console | None,
    description: str,
    chunk: int = 16,
) -> list[Any]:
    """``pool.evaluate`` in chunks, so that a progress bar on ``console`` can follow it."""
    results: list[Any] = []
    with step_progress(console, description, len(tasks)) as progress:
        for start in range(0, len(tasks), chunk):
            results += pool.evaluate(tasks[start : start + chunk], solutions[start : start + chunk])
            progress.advance(len(tasks[start : start + chunk]))
    return results


def evaluate_missing(
    samples: Dataset, tasks: Dataset, pool: Pool, console: Console | None = None
) -> tuple[Dataset, int]:
    """Fill ``result`` of samples that have none, through the pool; returns (samples, count)."""
    by_id = {row["id"]: task_from_row(row) for row in tasks}
    rows = list(samples)
    todo = [i for i, row in enumerate(rows) if not row.get("result")]
    if todo:
        results = _evaluate(
            pool,
            [by_id[rows[i]["task_id"]] for i in todo],
            [rows[i]["completion"] or "" for i in todo],
            console,
            "evaluate samples",
        )
        for i, result in zip(todo, results, strict=True):
            rows[i]["result"] = result.to_json()
    return make_dataset(rows, "samples"), len(todo)


def evaluate_missing_turns(
    trajectories: Dataset, tasks: Dataset, pool: Pool, console: Console | None = None
) -> tuple[Dataset, int]:
    """Fill ``result`` of trajectory turns that have none, through the pool."""
    by_id = {row["id"]: task_from_row(row) for row in tasks}
    rows = list(trajectories)
    todo = [
        (i, t)
        for i, row in enumerate(rows)
        for t, turn in enumerate(row["turns"])
        if not turn.get("result")
    ]
    if todo:
        results = _evaluate(
            pool,
            [by_id[rows[i]["task_id"]] for i, _ in todo],
            [rows[i]["turns"][t]["completion"] or "" for i, t in todo],
            console,
            "evaluate trajectory turns",
        )
        for (i, t), result in zip(todo, results, strict=True):
            rows[i]["turns"][t]["result"] = result.to_json()
            if not rows[i]["turns"][t].get("feedback"):
                rows[i]["turns"][t]["feedback"] = result.feedback
    return make_dataset(rows, "trajectories"), len(todo)


# ---------------------------------------------------------------------- 3: conversion
def sft_row(
    example_id: str,
    task_id: str,
    prompt: list[dict[str, str]],
    completion: str,
    result: EvalResult | None,
    kind: str,
    turn: int,
    origin: str,
    reasoning_format: str = "think",
) -> dict[str, Any]:
    reasoning, solution = split_completion(completion)
    target = format_completion(reasoning, solution, reasoning_format) if solution else completion
    row: dict[str, Any] = {
        "id": example_id,
        "task_id": task_id,
        "prompt": prompt,
        "completion": [{"role": "assistant", "content": target}],
        "reasoning": reasoning,
        "solution": solution,
        "reasoning_tokens": count_tokens(reasoning),
        "kind": kind,
        "turn": turn,
        "origin": origin,
    }
    if result is not None:
        row.update(result_columns(result))
    return row


def samples_to_sft(samples: Dataset, tasks: Dataset, reasoning_format: str = "think") -> Dataset:
    """SFT rows from measured samples (unfiltered; ``select_sft`` decides)."""
    prompts = {row["id"]: row["prompt"] for row in tasks}
    rows = [
        sft_row(
            s["id"],
            s["task_id"],
            s["prompt"] or prompts.get(s["task_id"]) or [],
            s["completion"] or "",
            result_of(s["result"]),
            "sample",
            0,
            s["origin"] or "",
            reasoning_format,
        )
        for s in samples
    ]
    return make_dataset(rows, "sft")


# ---------------------------------------------------------------------- 4: selection
@dataclass
class SelectConfig:
    """The SFT step's recipe keys (parsed next to ``CurateConfig``): how examples are written
    (``sft_reasoning_format``, for samples and revisions alike) and which are kept."""

    sft_min_speedup: float | None = field(
        default=1.0,
        metadata={"help": "minimum speedup vs sft_speedup_baseline, where timings mean something"},
    )
    sft_speedup_baseline: str = field(default="eager", metadata={"help": "eager | compile"})
    sft_require_meaningful_timing: bool = field(
        default=False, metadata={"help": "drop examples measured without meaningful timings (CPU)"}
    )
    sft_max_reasoning_tokens: int | None = field(
        default=8192, metadata={"help": "drop examples whose reasoning is longer"}
    )
    sft_cap_per_task: int = field(
        default=2, metadata={"help": "examples kept per task and kind (sample / revision)"}
    )
    sft_rank_by: str = field(
        default="concise",
        metadata={"help": "concise: shortest reasoning first; fastest: speedup first"},
    )
    sft_reasoning_format: str = field(
        default="think", metadata={"help": "reasoning in the completion: think | plain | none"}
    )


def _speedup(row: dict[str, Any], baseline: str) -> float | None:
    return row["speedup_vs_compile"] if baseline == "compile" else row["speedup_vs_eager"]


def _solution_key(row: dict[str, Any]) -> str:
    return hashlib.sha256(
        " ".join(normalized_tokens(row["solution"] or "", drop_boilerplate=False)).encode()
    ).hexdigest()


def select_sft(
    examples: Dataset, config: SelectConfig | None = None, console: Console | None = None
) -> tuple[Dataset, StepReport]:
    """Filter and rank SFT rows (see the module docstring); every drop has a reason."""
    config = config or SelectConfig()
    if config.sft_rank_by not in ("concise", "fastest"):
        raise ValueError(f"sft_rank_by must be concise or fastest, got {config.sft_rank_by!r}")
    report = StepReport("sft_select", count_in=len(examples))
    with timed(report):
        groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        seen_solutions: set[tuple[str, str, str]] = set()
        for row in examples:
            reason = _rejection(row, config)
            if reason:
                report.remove(row["id"], *reason)
                continue
            # A revision with the same final code as a sample is still another lesson (its prompt
            # holds the failed attempt and the feedback): duplicates are counted per kind.
            key = (row["task_id"], row["kind"], _solution_key(row))
            if key in seen_solutions:
                report.remove(
                    row["id"],
                    "same_solution",
                    "an identical solution of this task (and kind) is already kept",
                )
                continue
            seen_solutions.add(key)
            groups[(row["task_id"], row["kind"])].append(row)
        kept: list[dict[str, Any]] = []
        for (_task, _kind), rows in groups.items():
            rows.sort(key=lambda r: _rank_key(r, config))
            kept.extend(rows[: config.sft_cap_per_task])
            for row in rows[config.sft_cap_per_task :]:
                report.remove(
                    row["id"],
                    "over_task_cap",
                    f"{len(rows)} candidates for {row['task_id']} ({row['kind']}); kept the {config.sft_cap_per_task} "
                    f"{'most concise' if config.sft_rank_by == 'concise' else 'fastest'}",
                    reasoning_tokens=row["reasoning_tokens"],
                )
        kept.sort(key=lambda r: (r["task_id"], r["kind"], r["turn"], r["id"]))
    result = make_dataset(kept, "sft")
    report.count_out = len(result)
    log_step(report, console)
    return result, report


def _rejection(row: dict[str, Any], config: SelectConfig) -> tuple[str, str] | None:
    if row["status"] is None:
        return "not_evaluated", "no EvalResult for this sample"
    if not row["correct"]:
        return f"not_correct:{row['status']}", f"status {row['status']}"
    if row["checks_failed"]:
        return "failed_checks", ", ".join(row["checks_failed"])
    if not row["solution"]:
        return "no_solution", "no ModelNew code block"
    speedup = _speedup(row, config.sft_speedup_baseline)
    if not row["timing_meaningful"]:
        if config.sft_require_meaningful_timing:
            return "timing_not_meaningful", f"measured on {row['device_name']}: no speedup"
    elif config.sft_min_speedup is not None and (
        speedup is None or speedup < config.sft_min_speedup
    ):
        return (
            "too_slow",
            f"speedup vs {config.sft_speedup_baseline} {speedup} < {config.sft_min_speedup}",
        )
    if (
        config.sft_max_reasoning_tokens is not None
        and row["reasoning_tokens"] > config.sft_max_reasoning_tokens
    ):
        return (
            "reasoning_too_long",
            f"{row['reasoning_tokens']} > {config.sft_max_reasoning_tokens} tokens",
        )
    return None


def _rank_key(row: dict[str, Any], config: SelectConfig) -> tuple[float, float, str]:
    speedup = _speedup(row, config.sft_speedup_baseline) or 0.0
    if config.sft_rank_by == "fastest":
        return (-speedup, row["reasoning_tokens"], row["id"])
    return (row["reasoning_tokens"], -speedup, row["id"])


def concat_sft(parts: Iterable[Dataset]) -> Dataset:
    return make_dataset([row for part in parts for row in part], "sft")
