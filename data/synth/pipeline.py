"""The synthetic-task run: generate -> curation's steps -> splits -> sandbox -> SFT references.

What is validated where:

1. **Every task, in-process** (``check``): built and called on the ``meta`` device at the GPU
   sizes (shape and dtype as the graph infers) and on real tensors at the CPU sizes, twice
   (finite, shape and dtype, not constant). The code is ours, so this is not running
   untrusted code outside the sandbox.
2. **Every task, by reading it**: curation's ``normalize`` (the KernelBench contract, from
   the AST), ``dedup`` (computation signatures), ``decontaminate`` (n-gram overlap with the
   benchmark sources) and ``difficulty`` (operators and structural difficulty from the AST).
3. **A seeded sample plus every reference candidate, in the sandbox**: curation's
   ``validate`` runs each reference twice in fresh sandboxed children and judges the pair
   (crashes, non-finite or constant outputs, nondeterminism). A task that fails is removed
   from the dataset and counted in the report; with ``sandbox_sample`` tasks drawn from all
   splits, the report's failure count estimates the broken share of the unvalidated rest.
4. **Every reference solution, by the environment**: the candidate is evaluated through the
   pool (integrity checks, sandboxed run, comparison with the reference on the device) and
   becomes an SFT row only when judged ``correct`` (``references``).

Splits are by operator combination (``split``); reference solutions are written for training
tasks only, so no held-out or validation task reaches the SFT set.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datasets import Dataset, Features, List, Value
from rich.console import Console

from kernelrl.data.curate.decontaminate import Benchmark, decontaminate
from kernelrl.data.curate.dedup import dedup
from kernelrl.data.curate.difficulty import DifficultyConfig, tag_difficulty
from kernelrl.data.curate.normalize import normalize_tasks
from kernelrl.data.curate.report import StepReport, steps_table, write_reports
from kernelrl.data.curate.validate import validate_tasks
from kernelrl.data.schema import TASK_FEATURES, make_dataset
from kernelrl.data.synth.config import SynthConfig
from kernelrl.data.synth.generate import generate_tasks
from kernelrl.data.synth.graph import Graph
from kernelrl.data.synth.references import pick_candidates, reference_sft
from kernelrl.data.synth.split import SPLITS, check_split, split_combinations
from kernelrl.env.pools import Pool

#: The task schema plus the generator's own columns (the environment reads only the first).
SYNTH_FEATURES = Features(
    {
        **TASK_FEATURES,
        "family": Value("string"),
        "dtype": Value("string"),
        "combination": Value("string"),
        "synth_ops": List(Value("string")),
        "graph": Value("string"),
        "split": Value("string"),
    }
)


@dataclass
class SynthResult:
    splits: dict[str, Dataset]
    sft: Dataset | None
    reports: list[StepReport]
    summary: dict[str, Any]
    output_dir: Path


def _with_graph_columns(
    tasks: Dataset, graphs: dict[str, Graph], splits: dict[str, str]
) -> Dataset:
    rows = []
    for row in tasks:
        graph = graphs[row["id"]]
        rows.append(
            {
                **row,
                "family": graph.family,
                "dtype": graph.dtype,
                "combination": graph.combination,
                "synth_ops": sorted({op.kind for op in graph.ops}),
                "graph": json.dumps(graph.to_dict(), sort_keys=True),
                "split": splits[graph.combination],
            }
        )
    return Dataset.from_list(rows, features=SYNTH_FEATURES)


def _sandbox_set(
    tasks: Dataset, graphs: dict[str, Graph], config: SynthConfig
) -> tuple[list[str], list[str]]:
    """(seeded sample of all tasks, reference candidates among training tasks of the
    reference tier)."""
    ids = tasks["id"]
    rng = random.Random(config.seed + 1)
    sample = rng.sample(ids, min(config.sandbox_sample, len(ids)))
    train = [
        i
        for i, s in enumerate(tasks["split"])
        if s == "train" and config.in_reference_tier(graphs[ids[i]])
    ]
    candidates = pick_candidates(
        [ids[i] for i in train],
        [tasks["family"][i] for i in train],
        config.reference_solutions,
        config.seed + 2,
    )
    return sample, candidates


def sandbox_failures(report: StepReport) -> list[str]:
    """The tasks the sandbox found broken, to be removed. A ``harness_error`` is our failure,
    not the task's: removing such a task would change the dataset (and, after the split, its
    splits) because the environment failed, so the run stops and says so instead."""
    ours = [r for r in report.removed if r.reason == "harness_error"]
    if ours:
        raise RuntimeError(
            f"the sandbox could not judge {len(ours)} task(s) ({ours[0].id}: {ours[0].detail}): "
            "a failure of the environment, not of the tasks; nothing was written"
        )
    return [r.id for r in report.removed]


def run_synthesis(
    config: SynthConfig,
    pool: Pool | None = None,
    console: Console | None = None,
    command: str = "",
) -> SynthResult:
    """Generate, curate, split, validate and write everything under ``config.output_dir``."""
    if not config.output_dir:
        raise ValueError("output_dir is required")
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    reports: list[StepReport] = []

    raw, report = generate_tasks(config, console)
    reports.append(report)
    graphs = {row["id"]: row["graph"] for row in raw}
    tasks = _curated(config, raw, reports, console)

    combos = [graphs[i].combination for i in tasks["id"]]
    assignment = split_combinations(
        combos,
        config.heldout_share,
        config.validation_share,
        config.seed,
        config.eval_min_pointwise,
    )
    tasks = _with_graph_columns(tasks, graphs, assignment)
    problems = check_split(tasks["combination"], tasks["split"], config.eval_min_pointwise)
    if problems:  # split_combinations guarantees none; a violation is a bug of ours
        raise RuntimeError(f"split violates its promise: {problems[:3]}")

    tasks, checked = _sandboxed(config, tasks, graphs, pool, reports, console)
    sample, candidates, sandbox_failed, samples, sft = checked

    splits = {name: tasks.filter(lambda r, n=name: r["split"] == n) for name in SPLITS}
    summary = _summary(
        config, tasks, graphs, splits, sample, candidates, sandbox_failed, samples, sft
    )
    summary["seconds"] = round(time.perf_counter() - started, 1)
    _write(out, config, splits, sft, samples, reports, summary, command)
    if console is not None:
        console.print(
            steps_table(
                reports, title=f"synthetic tasks: {config.name} ({summary['seconds']:.0f} s)"
            )
        )
        console.print(
            f"wrote {len(tasks)} tasks ("
            + ", ".join(f"{n} {len(d)}" for n, d in splits.items())
            + f") and {len(sft) if sft is not None else 0} verified reference solutions to {out}"
        )
    return SynthResult(splits, sft, reports, summary, out)


def _sandboxed(
    config: SynthConfig,
    tasks: Dataset,
    graphs: dict[str, Graph],
    pool: Pool | None,
    reports: list[StepReport],
    console: Console | None,
) -> tuple[Dataset, tuple[Any, ...]]:
    """The seeded sample and the reference candidates run in the sandbox (the broken removed),
    then the candidates' references judged by the environment: (tasks, (sample, candidates,
    removed, evaluated samples, SFT rows))."""
    sample, candidates = _sandbox_set(tasks, graphs, config)
    wanted = set(sample) | (set(candidates) if config.validate_candidates else set())
    sandbox_ids = [i for i, task_id in enumerate(tasks["id"]) if task_id in wanted]
    sft = samples = None
    sandbox_failed: list[str] = []
    if sandbox_ids:
        validated, report = validate_tasks(
            tasks.select(sandbox_ids),
            config.validate,
            console,
            device=config.env_device,
            seed=config.seed,
        )
        report.notes.update(sample=len(sample), reference_candidates=len(candidates))
        reports.append(report)
        sandbox_failed = sandbox_failures(report)
        passed = {row["id"]: row for row in validated}
        rows = []
        for row in tasks:
            if row["id"] in sandbox_failed:
                continue
            rows.append({**row, **passed[row["id"]]} if row["id"] in passed else row)
        tasks = Dataset.from_list(rows, features=SYNTH_FEATURES)
        keep = [
            i
            for i, task_id in enumerate(tasks["id"])
            if task_id in candidates and (task_id in passed or not config.validate_candidates)
        ]
        if keep:
            owned = pool is None
            if pool is None:
                pool = config.make_pool()
            try:
                samples, sft, step_reports = reference_sft(
                    tasks.select(keep), graphs, pool, config.sft, console
                )
            finally:
                if owned:
                    pool.close()
            reports.extend(step_reports)

    return tasks, (sample, candidates, sandbox_failed, samples, sft)


def _curated(
    config: SynthConfig,
    raw: list[dict[str, Any]],
    reports: list[StepReport],
    console: Console | None,
) -> Dataset:
    """The generated tasks through curation's reading steps: the KernelBench contract,
    computation dedup, decontamination against the benchmarks, difficulty tags."""
    tasks = make_dataset([{k: v for k, v in row.items() if k != "graph"} for row in raw], "tasks")
    tasks, report = normalize_tasks(
        tasks, config.backend, config.prompt_template, console, one_shot=config.one_shot
    )
    reports.append(report)
    tasks, report = dedup(tasks, config.dedup, console=console)
    reports.append(report)
    if config.benchmark_sources:
        benchmark = Benchmark.from_sources(config.benchmark_sources, config.decontaminate)
        tasks, report = decontaminate(tasks, benchmark, console=console)
        reports.append(report)
    tasks, report = tag_difficulty(tasks, DifficultyConfig(), console=console)
    reports.append(report)
    return tasks


def _summary(
    config: SynthConfig,
    tasks: Dataset,
    graphs: dict[str, Graph],
    splits: dict[str, Dataset],
    sample: list[str],
    candidates: list[str],
    sandbox_failed: list[str],
    samples: Dataset | None,
    sft: Dataset | None,
) -> dict[str, Any]:
    from collections import Counter

    statuses = Counter(json.loads(r)["status"] for r in samples["result"]) if samples else Counter()
    return {
        "name": config.name,
        "seed": config.seed,
        "size_profile": config.size_profile,
        "tasks": len(tasks),
        "splits": {n: len(d) for n, d in splits.items()},
        "combinations": {n: len(set(d["combination"])) for n, d in splits.items()},
        "families": dict(Counter(tasks["family"])),
        "dtypes": dict(Counter(tasks["dtype"])),
        "difficulty": dict(Counter(tasks["difficulty"])),
        "pointwise": {
            n: dict(sorted(Counter(graphs[i].pointwise for i in d["id"]).items()))
            for n, d in splits.items()
        },
        "reference_max_pointwise": config.reference_max_pointwise,
        "sandbox": {
            "validated": sum(bool(v) for v in tasks["validated"]),
            "sample": len(sample),
            "reference_candidates": len(candidates),
            "failed": sandbox_failed,
        },
        "reference_solutions": {
            "evaluated": len(samples) if samples is not None else 0,
            "statuses": dict(statuses),
            "verified_in_sft": len(sft) if sft is not None else 0,
        },
    }


def _write(
    out: Path,
    config: SynthConfig,
    splits: dict[str, Dataset],
    sft: Dataset | None,
    samples: Dataset | None,
    reports: list[StepReport],
    summary: dict[str, Any],
    command: str,
) -> None:
    for name, data in splits.items():
        folder = out / "tasks" / name
        folder.mkdir(parents=True, exist_ok=True)
        data.to_parquet(str(folder / "data.parquet"))
    if sft is not None:
        (out / "sft").mkdir(exist_ok=True)
        sft.to_parquet(str(out / "sft" / "data.parquet"))
    if samples is not None:
        (out / "evaluated").mkdir(exist_ok=True)
        samples.to_parquet(str(out / "evaluated" / "references.parquet"))
    write_reports(reports, out)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "recipe.json").write_text(
        json.dumps({**config.to_dict(), "command": command}, indent=1, default=str)
    )
