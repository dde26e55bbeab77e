"""The learning benchmark's answers: one row per judged answer, written beside every summary.

Every figure of the report (per-stage rates, paired differences, the by-operator table, the
pooled RL - SFT gain over seeds) is computed from these rows and from nothing else, so that
``learning_recompute.py`` can recompute it from ``answers.jsonl.gz`` alone, and answers of runs
made in separate GPU sessions (one seed each) can be pooled by concatenating their files.

A row is the final turn of one sample of one task at one stage: which (``seed``, ``stage``,
``stage_name``, ``split``, ``task_id``, ``operator``, ``sample``, ``turn``), its verdict
(``status``, ``scored``, ``checks_failed``) and the per-answer outcomes the rates average
(``correct``, ``format_error``, ``token_limit``, ``compile``, ``integrity``, ``reward``).
Unscored answers (``harness_error``: our failure, not the model's) are kept with
``scored: false`` and left out of every rate, as the report always did.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

#: The per-answer outcomes the report's rates average, in its column order.
OUTCOMES = ("correct", "format_error", "token_limit", "compile", "integrity", "reward")
#: Every column of a row, in order.
FIELDS = (
    "seed",
    "stage",
    "stage_name",
    "split",
    "task_id",
    "operator",
    "sample",
    "turn",
    "scored",
    "status",
    "checks_failed",
    "finish_reason",
    *OUTCOMES,
)
#: The role of the three evaluations the protocol compares; any other stage keeps its name.
ROLES = {"eval_base": "base", "eval_sft": "sft", "kb_base": "base", "kb_sft": "sft"}
ANSWERS_FILE = "answers.jsonl.gz"


def stage_role(stage_name: str, rl_stage: str, rl_kb_stage: str = "kb_rl") -> str:
    """``base``, ``sft`` or ``rl`` for the evaluations the report compares (``rl_stage``: this
    run's RL evaluation, whose name carries its variant's suffix), else the stage's own name."""
    if stage_name in (rl_stage, rl_kb_stage):
        return "rl"
    return ROLES.get(stage_name, stage_name)


def answer_rows(
    samples: Path,
    reward_config: Any,
    *,
    seed: int,
    stage: str,
    stage_name: str,
    split_of: Callable[[str], str],
    operators: dict[str, str],
) -> list[dict[str, Any]]:
    """The final turn of every sample in a sweep's ``samples.jsonl``, as answer rows (file
    order). ``reward_config``: the RL recipe's reward, so that held-out reward and training
    reward are one function; ``split_of``: task id -> split label."""
    from kernelrl.env.result import Status
    from kernelrl.eval.metrics import compiled, last_view
    from kernelrl.eval.records import read_records
    from kernelrl.rewards import is_scored, rewarded, total_reward

    rows = []
    for record in last_view(read_records(samples)):
        result = record.result
        scored = is_scored(result)
        rows.append(
            {
                "seed": seed,
                "stage": stage,
                "stage_name": stage_name,
                "split": split_of(record.task_id),
                "task_id": record.task_id,
                "operator": operators.get(record.task_id, record.category or "unknown"),
                "sample": record.sample,
                "turn": record.turn,
                "scored": scored,
                "status": result.status.value,
                "checks_failed": list(result.checks_failed),
                "finish_reason": record.finish_reason,
                "correct": float(bool(result.correct)),
                "format_error": float(result.status is Status.FORMAT_ERROR),
                "token_limit": float(record.finish_reason == "length"),
                "compile": float(compiled(result)),
                "integrity": float(result.status is Status.INTEGRITY_VIOLATION),
                # 0 where no reward is given: a harness_error, or a GPU result without a judged
                # speed (kernelrl.rewards.rewarded), whose total is NaN
                "reward": float(total_reward(result, reward_config)) if rewarded(result) else 0.0,
            }
        )
    return rows


def write_answers(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    """``rows`` as gzipped JSON lines, byte-identical for identical rows (no timestamp in the
    gzip header), in the order given: the order the figures were computed in."""
    lines = "".join(json.dumps({k: row[k] for k in FIELDS}) + "\n" for row in rows)
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as handle:
        handle.write(lines.encode())
    partial.replace(path)


def read_answers(path: Path) -> list[dict[str, Any]]:
    """The rows of one ``answers.jsonl.gz``; a missing column is refused with the file's name."""
    rows = []
    with gzip.open(path, "rt") as handle:
        for number, line in enumerate(handle, 1):
            row = json.loads(line)
            missing = [k for k in FIELDS if k not in row]
            if missing:
                raise SystemExit(f"{path}:{number}: no {', '.join(missing)}")
            rows.append(row)
    return rows


def by_task(rows: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, float]]]:
    """task id -> the outcomes of its scored answers, in row order: what ``estimate`` takes."""
    tasks: dict[str, list[dict[str, float]]] = {}
    for row in rows:
        if row["scored"]:
            tasks.setdefault(row["task_id"], []).append({m: row[m] for m in OUTCOMES})
    return tasks


def stage_runs(
    rows: Iterable[dict[str, Any]], seed: int, split: str
) -> dict[str, dict[str, list[dict[str, float]]]]:
    """stage -> task -> outcomes for one seed and one split; stages in order of appearance."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row["seed"] == seed and row["split"] == split:
            grouped.setdefault(row["stage"], []).append(row)
    return {stage: by_task(stage_rows) for stage, stage_rows in grouped.items()}


def attempts(samples: Path, reward_config: Any) -> dict[str, list[dict[str, float]]]:
    """task id -> per-sample outcomes of the final turn of one sweep (validation, curriculum):
    harness errors left out, as in every rate."""
    rows = answer_rows(
        samples,
        reward_config,
        seed=0,
        stage="",
        stage_name="",
        split_of=lambda _: "",
        operators={},
    )
    return by_task(rows)
