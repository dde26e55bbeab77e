"""Every figure of the learning benchmark's report, computed from answer rows alone.

One function, ``figures``, is what both the report (``learning_output``) and the recomputation
(``learning_recompute.py``) call: the report on the rows it has just written to
``answers.jsonl.gz``, the recomputation on the rows read back from one or more such files
(several seeds' runs, made in separate sessions). What they write must therefore agree, and
``learning_recompute.py --check`` says where it does not.

The figures: per seed, the report's table over the held-out split (each stage's rates with
bootstrap intervals, the paired differences; ``learning_report.estimate``) and the same for the
KernelBench level-1 set; per seed, the by-operator counts on the tasks every stage judged
(``learning_families.by_operator``); and RL - SFT pooled over seeds with its two-way bootstrap
interval (``learning_report.pooled``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from learning_answers import stage_runs
from learning_families import by_operator
from learning_report import POOLED_RESAMPLES, POOLED_SEED, estimate, pooled

HELDOUT_SPLITS = ("heldout_fresh", "heldout")
KERNELBENCH_SPLIT = "kernelbench_level1"
#: The per-seed tables' bootstrap, as ``learning.py --resamples`` and ``--seed`` default to.
TABLE_RESAMPLES = 2000
TABLE_SEED = 0


def heldout_split(rows: list[dict[str, Any]]) -> str:
    """The held-out split the rows answer: a fresh one where there is one (the protocol's),
    else the synthesis's own. Rows answering both are refused: they are two experiments."""
    present = [s for s in HELDOUT_SPLITS if any(r["split"] == s for r in rows)]
    if len(present) != 1:
        raise SystemExit(f"answers hold held-out splits {present}: expected exactly one")
    return present[0]


def samples_per_task(rows: list[dict[str, Any]]) -> int:
    """k: the samples each task was asked for, the most any (stage, task) has (scored or not)."""
    counts = Counter((r["seed"], r["stage"], r["task_id"]) for r in rows)
    return max(counts.values())


def _table(runs: dict[str, Any], k: int, resamples: int, table_seed: int) -> dict[str, Any]:
    tasks = sorted({t for stage in runs.values() for t in stage})
    return estimate(runs, tasks, k, resamples, table_seed)


def figures(
    rows: list[dict[str, Any]],
    resamples: int = TABLE_RESAMPLES,
    table_seed: int = TABLE_SEED,
    pooled_resamples: int = POOLED_RESAMPLES,
    pooled_seed: int = POOLED_SEED,
) -> dict[str, Any]:
    """The report's figures (see the module docstring). Seeds are the rows' ``seed`` values;
    stages keep the order in which the rows first name them."""
    split = heldout_split(rows)
    heldout = [r for r in rows if r["split"] == split]
    k = samples_per_task(heldout)
    seeds = sorted({r["seed"] for r in heldout})
    result: dict[str, Any] = {"split": split, "k": k, "per_seed": {}, "families": {}}
    runs_by_seed = {}
    for seed in seeds:
        runs = stage_runs(heldout, seed, split)
        runs_by_seed[seed] = runs
        result["per_seed"][str(seed)] = _table(runs, k, resamples, table_seed)
        seed_rows = [r for r in heldout if r["seed"] == seed]
        result["families"][str(seed)] = by_operator(seed_rows, list(runs), k)
    comparable = [s for s in seeds if {"sft", "rl"} <= set(runs_by_seed[s])]
    result["pooled"] = (
        pooled(
            {s: runs_by_seed[s] for s in comparable}, k, "sft", "rl", pooled_resamples, pooled_seed
        )
        if comparable
        else None
    )
    kb_rows = [r for r in rows if r["split"] == KERNELBENCH_SPLIT]
    result["kernelbench"] = {}
    for seed in sorted({r["seed"] for r in kb_rows}):
        runs = stage_runs(kb_rows, seed, KERNELBENCH_SPLIT)
        try:
            table = _table(runs, samples_per_task(kb_rows), resamples, table_seed)
        except ValueError as exc:  # no task judged at every stage: said, not hidden
            table = {"error": str(exc)}
        result["kernelbench"][str(seed)] = table
    return result
