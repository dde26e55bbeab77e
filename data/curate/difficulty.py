"""Difficulty tags: operators and their categories (AST), reference runtime, model pass rate.

- ``ops`` / ``op_categories``: read from the AST of the task (never executed; ``operators``);
  a task without a category gets one from them (``infer_category``).
- ``runtime_bucket``: the reference's median runtime measured by ``validate`` on its device.
- ``pass_rate`` (optional): the share of ``pass_rate_k`` samples of a model that the
  environment judged correct, through the pool; ``generate`` is given by the caller
  (``launch`` owns models and builds it from this step's ``pass_rate_*`` keys).
- ``difficulty``: from the pass rate when there is one (easy >= 0.5 > medium > 0 = hard),
  otherwise from the structure (see ``structural_difficulty``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from datasets import Dataset
from rich.console import Console

from kernelrl.data.curate.operators import OP_CATEGORY, infer_category, op_categories, task_ops
from kernelrl.data.curate.report import StepReport, log_step, step_progress, timed
from kernelrl.data.curate.resume import Journal
from kernelrl.data.schema import make_dataset
from kernelrl.env.pools import Pool
from kernelrl.env.task import task_from_row

# Generation callable: prompts (message lists) and k -> k completions per prompt.
Generate = Callable[[Sequence[list[dict[str, str]]], int], list[list[str]]]

HEAVY = {"matmul", "convolution", "attention", "recurrent"}
MEDIUM = {"normalization", "softmax", "scan", "loss", "pooling", "indexing"}


def structural_difficulty(ops: Sequence[str]) -> str:
    """hard: attention, recurrence, or a matmul/conv fused with 3+ other compute ops, or 6+ ops;
    medium: any matmul/conv/norm/softmax/scan/loss/pooling/indexing, or 3+ compute ops;
    easy: up to two elementwise, activation or reduction ops."""
    compute = [op for op in ops if OP_CATEGORY.get(op) != "layout"]
    categories = set(op_categories(compute))
    if categories & {"attention", "recurrent"} or len(compute) >= 6:
        return "hard"
    if categories & HEAVY and len(compute) >= 4:
        return "hard"
    if categories & (HEAVY | MEDIUM) or len(compute) >= 3:
        return "medium"
    return "easy"


def runtime_bucket(runtime_ms: float | None) -> str | None:
    if runtime_ms is None:
        return None
    for limit, label in ((0.1, "<0.1ms"), (1.0, "0.1-1ms"), (10.0, "1-10ms"), (100.0, "10-100ms")):
        if runtime_ms < limit:
            return label
    return ">=100ms"


def pass_difficulty(pass_rate: float) -> str:
    return "easy" if pass_rate >= 0.5 else "medium" if pass_rate > 0 else "hard"


@dataclass
class DifficultyConfig:
    """The difficulty step's recipe keys (parsed next to ``CurateConfig``): the pass-rate model
    (used only when one is given) and the pass-rate filter."""

    pass_rate_model: str | None = field(
        default=None, metadata={"help": "model name or path; enables pass rates"}
    )
    pass_rate_client: str = field(default="transformers", metadata={"help": "transformers | vllm"})
    pass_rate_k: int = field(default=4, metadata={"help": "samples per task for the pass rate"})
    pass_rate_max_new_tokens: int = field(
        default=1024, metadata={"help": "tokens per pass-rate sample"}
    )
    pass_rate_temperature: float = field(
        default=0.8, metadata={"help": "sampling temperature of the pass-rate model"}
    )
    min_pass_rate: float | None = field(
        default=None, metadata={"help": "drop tasks below this pass rate (e.g. never solved)"}
    )
    max_pass_rate: float | None = field(
        default=None,
        metadata={"help": "drop tasks above this pass rate (e.g. always solved: no RL signal)"},
    )

    def model_settings(self) -> dict[str, Any]:
        """The keys that say how the pass-rate samples are generated (part of the pass-rate
        journal's key: other samples, other rates)."""
        keys = ("model", "client", "max_new_tokens", "temperature")
        return {f"pass_rate_{key}": getattr(self, f"pass_rate_{key}") for key in keys}


def pass_rates(tasks: Dataset, generate: Generate, pool: Pool, k: int) -> list[float]:
    """Share of ``k`` generated samples per task that the environment judged correct."""
    rows = list(tasks)
    completions = generate([row["prompt"] for row in rows], k)
    env_tasks = [task_from_row(row) for row in rows for _ in range(k)]
    flat = [c for per_task in completions for c in per_task]
    if len(flat) != len(env_tasks):
        raise ValueError(f"generate returned {len(flat)} completions for {len(rows)} tasks x k={k}")
    results = pool.evaluate(env_tasks, flat)
    return [sum(r.correct for r in results[i * k : (i + 1) * k]) / k for i in range(len(rows))]


def journaled_pass_rates(
    tasks: Dataset,
    generate: Generate,
    pool: Pool,
    k: int,
    journal: Journal | None = None,
    console: Console | None = None,
    chunk: int = 16,
) -> list[float]:
    """``pass_rates`` in chunks of tasks, each task's rate journaled as its chunk ends (an
    interrupted run resumes), with a progress bar on ``console``."""
    rows = list(tasks)
    hashes = [task_from_row(row).hash for row in rows]
    rates: dict[int, float] = {}
    for i, task_hash in enumerate(hashes):
        entry = journal.get(task_hash) if journal is not None else None
        if entry is not None:
            rates[i] = float(entry["pass_rate"])
    todo = [i for i in range(len(rows)) if i not in rates]
    with step_progress(console, f"pass rate (k={k})", len(rows), len(rates)) as progress:
        for start in range(0, len(todo), chunk):
            part = todo[start : start + chunk]
            part_rates = pass_rates(tasks.select(part), generate, pool, k)
            for i, rate in zip(part, part_rates, strict=True):
                rates[i] = rate
                if journal is not None:
                    journal.add(hashes[i], rows[i]["id"], {"pass_rate": rate})
            progress.advance(len(part))
    return [rates[i] for i in range(len(rows))]


def tag_difficulty(
    tasks: Dataset,
    config: DifficultyConfig | None = None,
    generate: Generate | None = None,
    pool: Pool | None = None,
    console: Console | None = None,
    journal: Journal | None = None,
) -> tuple[Dataset, StepReport]:
    """Add ops, categories, runtime bucket, pass rate (with a model) and difficulty."""
    config = config or DifficultyConfig()
    report = StepReport("difficulty", count_in=len(tasks))
    with timed(report):
        rates: list[float | None] = [None] * len(tasks)
        if generate is not None:
            if pool is None:
                raise ValueError("a pass rate needs a pool to evaluate the samples")
            rates = list(
                journaled_pass_rates(tasks, generate, pool, config.pass_rate_k, journal, console)
            )
            report.notes["pass_rate_k"] = config.pass_rate_k
        rows: list[dict[str, Any]] = []
        for row, rate in zip(tasks, rates, strict=True):
            ops = task_ops(row["source"])
            out = {
                **row,
                "category": row["category"]
                if row["category"] not in (None, "uncategorized")
                else infer_category(ops),
                "ops": ops,
                "op_categories": op_categories(ops),
                "num_ops": len([op for op in ops if OP_CATEGORY.get(op) != "layout"]),
                "runtime_bucket": runtime_bucket(row.get("ref_runtime_ms")),
                "pass_rate": rate,
                "pass_k": config.pass_rate_k if rate is not None else None,
                "difficulty": pass_difficulty(rate)
                if rate is not None
                else structural_difficulty(ops),
            }
            if (
                rate is not None
                and config.min_pass_rate is not None
                and rate < config.min_pass_rate
            ):
                report.remove(
                    row["id"], "pass_rate_too_low", f"pass rate {rate:.2f} < {config.min_pass_rate}"
                )
                continue
            if (
                rate is not None
                and config.max_pass_rate is not None
                and rate > config.max_pass_rate
            ):
                report.remove(
                    row["id"],
                    "pass_rate_too_high",
                    f"pass rate {rate:.2f} > {config.max_pass_rate}",
                )
                continue
            rows.append(out)
    result = make_dataset(rows, "tasks")
    report.count_out = len(result)
    log_step(report, console)
    return result, report
