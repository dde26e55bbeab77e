"""Dataset schemas: HF ``datasets`` Features for RL tasks, generated samples, SFT examples and
multi-turn trajectories.

Why fixed schemas: every producer (loaders, curation steps, RL rollouts, eval sweeps) and every
consumer (GRPO prompts, SFTTrainer, dataset cards) agree on column names and types, and Parquet
files written with these Features load back with the same types. Free-form, nested records
(an ``EvalResult``, a task's size variants, validation details) are stored as JSON strings: they
are versioned by their own code and Parquet needs no schema change when they grow.

Messages use the conversational format TRL expects (``[{"role": ..., "content": ...}]``), so an
RL task row is directly a GRPO prompt and an SFT row is a prompt-completion example.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from datasets import Dataset, Features, List, Value

from kernelrl.env.result import EvalResult
from kernelrl.env.task import Task

MESSAGE = {"role": Value("string"), "content": Value("string")}
MESSAGES = List(MESSAGE)

TASK_FEATURES = Features(
    {
        "id": Value("string"),
        "source": Value("string"),  # PyTorch reference in the KernelBench format
        "backend": Value("string"),  # triton | cuda
        "prompt": MESSAGES,
        "category": Value("string"),
        "level": Value("int32"),
        "atol": Value("float64"),
        "rtol": Value("float64"),
        "sizes": Value("string"),  # JSON: {device_kind: {global: value}}
        "origin": Value("string"),  # where the record came from (loader spec)
        "task_hash": Value("string"),
        # filled by validation (null until then)
        "validated": Value("bool"),
        "ref_device": Value("string"),
        "ref_runtime_ms": Value("float64"),
        "aten_ops": List(Value("string")),
        "validation": Value("string"),  # JSON details of the sandboxed reference runs
        # filled by difficulty tagging
        "ops": List(Value("string")),
        "op_categories": List(Value("string")),
        "num_ops": Value("int32"),
        "runtime_bucket": Value("string"),
        "pass_rate": Value("float64"),
        "pass_k": Value("int32"),
        "difficulty": Value("string"),
    }
)

# A generated solution for a task, before or after it was measured.
SAMPLE_FEATURES = Features(
    {
        "id": Value("string"),
        "task_id": Value("string"),
        "prompt": MESSAGES,
        "completion": Value("string"),  # raw model text: reasoning and the final code block
        "result": Value("string"),  # EvalResult JSON (null until evaluated)
        "origin": Value("string"),
    }
)

TURN = {
    "completion": Value("string"),
    "feedback": Value("string"),  # what the environment told the model after this turn
    "reward": Value("float64"),
    "result": Value("string"),  # EvalResult JSON (null until evaluated)
}

TRAJECTORY_FEATURES = Features(
    {
        "id": Value("string"),
        "task_id": Value("string"),
        "prompt": MESSAGES,  # the first turn's prompt
        "turns": List(TURN),
        "origin": Value("string"),
    }
)

SFT_FEATURES = Features(
    {
        "id": Value("string"),
        "task_id": Value("string"),
        "prompt": MESSAGES,  # task prompt, plus earlier attempts and feedback for revisions
        "completion": MESSAGES,  # the assistant turn to learn
        "reasoning": Value("string"),
        "solution": Value("string"),
        "reasoning_tokens": Value("int32"),
        "kind": Value("string"),  # "sample" | "revision"
        "turn": Value("int32"),
        # the measured result of ``solution``
        "status": Value("string"),
        "correct": Value("bool"),
        "checks_failed": List(Value("string")),
        "speedup_vs_eager": Value("float64"),
        "speedup_vs_compile": Value("float64"),
        "own_kernel_share": Value("float64"),
        "timing_meaningful": Value("bool"),
        "device_name": Value("string"),
        "result": Value("string"),  # full EvalResult JSON
        "origin": Value("string"),
    }
)

SCHEMAS: dict[str, Features] = {
    "tasks": TASK_FEATURES,
    "samples": SAMPLE_FEATURES,
    "trajectories": TRAJECTORY_FEATURES,
    "sft": SFT_FEATURES,
}


def _json_text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


def _messages(value: Any) -> list[dict[str, str]] | None:
    """A plain string prompt becomes one user message; message lists are kept as they are."""
    if value is None:
        return None
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in value]


def conform(row: Mapping[str, Any], features: Features) -> dict[str, Any]:
    """One row shaped to ``features``: missing columns become null, unknown ones are dropped,
    nested records that the schema stores as JSON text are serialised."""
    out: dict[str, Any] = {}
    for name, feature in features.items():
        value = row.get(name)
        if isinstance(feature, Value) and feature.dtype == "string" and value is not None:
            value = _json_text(value) if isinstance(value, dict | list) else str(value)
        elif name in ("prompt", "completion") and isinstance(feature, List):
            value = _messages(value)
        elif name == "turns" and value is not None:
            value = [
                {
                    "completion": t.get("completion"),
                    "feedback": t.get("feedback"),
                    "reward": t.get("reward"),
                    "result": _json_text(t.get("result")),
                }
                for t in value
            ]
        out[name] = value
    return out


def make_dataset(rows: Iterable[Mapping[str, Any]], kind: str) -> Dataset:
    """A Dataset of ``kind`` (tasks, samples, trajectories, sft) with the fixed Features."""
    features = SCHEMAS[kind]
    conformed = [conform(r, features) for r in rows]
    if not conformed:  # from_list cannot build an empty table with a schema
        return Dataset.from_dict({name: [] for name in features}, features=features)
    return Dataset.from_list(conformed, features=features)


# ------------------------------------------------- task -> row (row -> Task: env.task.task_from_row)
def task_row(
    task: Task, origin: str = "", prompt: list[dict[str, str]] | None = None
) -> dict[str, Any]:
    return {
        "id": task.id,
        "source": task.source,
        "backend": task.backend,
        "prompt": prompt,
        "category": task.category,
        "level": task.level,
        "atol": task.atol,
        "rtol": task.rtol,
        "sizes": json.dumps(dict(task.sizes), sort_keys=True),
        "origin": origin,
        "task_hash": task.hash,
    }


def result_of(text: str | Mapping[str, Any] | None) -> EvalResult | None:
    if text is None or text == "":
        return None
    return EvalResult.from_dict(json.loads(text) if isinstance(text, str) else dict(text))


def result_columns(result: EvalResult) -> dict[str, Any]:
    """The measured-result columns of an SFT row."""
    return {
        "status": str(result.status),
        "correct": result.correct,
        "checks_failed": list(result.checks_failed),
        "speedup_vs_eager": result.speedup_vs_eager,
        "speedup_vs_compile": result.speedup_vs_compile,
        "own_kernel_share": result.own_kernel_share,
        "timing_meaningful": result.timing_meaningful,
        "device_name": result.device_name,
        "result": result.to_json(),
    }
