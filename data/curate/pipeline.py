"""The curation pipeline: recipe (``config``) -> steps -> Parquet datasets, card, plots, reports.

Order matters for cost: the cheap text-only steps (normalize, dedup, decontaminate) run before
the steps that execute code (validate, pass rate, sample evaluation), so no sandbox time is
spent on records that would be dropped anyway. Steps can be switched off in the recipe.

The pipeline never loads a model: a pass rate needs a ``generate`` callable, which
``kernelrl.launch`` builds from the recipe's model (dependency arrows: only launch resolves
models). Evaluations go through a pool with the environment's Pool contract; a ``LocalPool``
is made when the caller gives none.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datasets import Dataset
from rich.console import Console

from kernelrl.data.curate.card import write_card
from kernelrl.data.curate.config import CurateConfig
from kernelrl.data.curate.decontaminate import (
    Benchmark,
    decontaminate,
    write_decontamination_report,
)
from kernelrl.data.curate.dedup import dedup, write_dedup_report
from kernelrl.data.curate.difficulty import Generate, tag_difficulty
from kernelrl.data.curate.normalize import normalize_tasks
from kernelrl.data.curate.plots import make_plots
from kernelrl.data.curate.report import StepReport, log_step, steps_table, timed, write_reports
from kernelrl.data.curate.resume import (
    STATE_DIR,
    Journal,
    StepStore,
    dataset_fingerprint,
    fingerprint,
)
from kernelrl.data.curate.sft_select import (
    attach_to_tasks,
    concat_sft,
    evaluate_missing,
    evaluate_missing_turns,
    fill_prompts,
    samples_to_sft,
    select_sft,
)
from kernelrl.data.curate.trajectories_to_sft import trajectories_to_sft
from kernelrl.data.curate.validate import validate_tasks
from kernelrl.data.loaders import load_samples, load_tasks, load_trajectories
from kernelrl.env.evaluator import resolve_device
from kernelrl.env.pools import Pool


@dataclass
class CurationResult:
    tasks: Dataset
    sft: Dataset | None
    reports: list[StepReport]
    output_dir: Path
    card: Path


def _save_parquet(dataset: Dataset, folder: Path) -> Path:
    """Written to a temporary name and renamed: a killed run never leaves half a file."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "train-00000-of-00001.parquet"
    tmp = folder / ".train.parquet.tmp"
    dataset.to_parquet(str(tmp))
    for old in folder.glob("*.parquet"):
        old.unlink()
    os.replace(tmp, path)
    return path


class _LazyPool:
    """The recipe's pool, made on first use and closed by the pipeline (only if it made it)."""

    def __init__(self, config: CurateConfig, pool: Pool) -> None:
        self.config, self.pool, self.owned = config, pool, False

    def get(self) -> Any:
        if self.pool is None:
            self.pool = self.config.make_pool()
            self.owned = True
        return self.pool

    def close(self) -> None:
        if self.owned and self.pool is not None:
            self.pool.close()


class CurationInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run; the message says what was kept and how to resume."""


class _Steps:
    """Runs steps through their checkpoints (``resume.StepStore``); collects the reports."""

    def __init__(self, out: Path, console: Console | None) -> None:
        self.store = StepStore(out)
        self.console = console
        self.reports: list[StepReport] = []
        self.journals: list[Journal] = []
        self.index = 0
        self.current = ""

    def run(
        self,
        name: str,
        data: Dataset,
        settings: Any,
        step: Callable[[Dataset], tuple[Dataset, StepReport]],
    ) -> Dataset:
        """``step(data)``, or its checkpoint when one matches its input and ``settings``."""
        self.index += 1
        self.current = name
        key = fingerprint(name, settings, dataset_fingerprint(data))
        loaded = self.store.load(self.index, name, key)
        if loaded is not None:
            result, report = loaded
            if self.console is not None:
                self.console.print(f"{name}: finished in an earlier run, loaded its checkpoint")
        else:
            result, report = step(data)
            self.store.save(self.index, name, key, result, report)
        self.reports.append(report)
        return result

    def journal(self, name: str, settings: Any) -> Journal:
        journal = self.store.journal(name, fingerprint(name, settings))
        if journal.loaded and self.console is not None:
            self.console.print(
                f"{name}: {journal.loaded} records finished in an earlier run "
                f"(journal {journal.path}); running the rest"
            )
        self.journals.append(journal)
        return journal

    def interrupted(self, out: Path) -> str:
        kept = ", ".join(self.store.kept) or "no step"
        records = sum(len(j.entries) for j in self.journals if j.entries)
        partial = f" and {records} finished records of {self.current}" if records else ""
        return (
            f"interrupted during {self.current}: kept {kept}{partial} in {out / STATE_DIR}; "
            "rerun the same command to resume"
        )


def run_curation(
    config: CurateConfig,
    pool: Pool | None = None,
    generate: Generate | None = None,
    console: Console | None = None,
    command: str = "",
) -> CurationResult:
    """Run the recipe's steps and write everything under ``config.output_dir``.

    Finished steps are checkpointed and per-record results of the sandboxed steps journaled
    under ``output_dir/.curate_state`` (``resume``): the same call after an interruption
    resumes. Ctrl-C raises ``CurationInterrupted`` whose message says what was kept.
    """
    if not config.output_dir:
        raise ValueError("output_dir is required")
    if not config.task_sources:
        raise ValueError("task_sources is empty: nothing to curate")
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    steps = set(config.steps)
    runner = _Steps(out, console)
    lazy = _LazyPool(config, pool)
    started = time.perf_counter()
    try:
        tasks, sft = _run_steps(config, steps, runner, lazy, generate, out, console)
    except KeyboardInterrupt as exc:
        raise CurationInterrupted(runner.interrupted(out)) from exc
    finally:
        lazy.close()
    reports = runner.reports

    _save_parquet(tasks, out / "tasks")
    if sft is not None:
        _save_parquet(sft, out / "sft")
    write_reports(reports, out)
    plots = make_plots(tasks, sft, reports, out / "plots")
    card = write_card(
        out, config.name, tasks, sft, reports, plots, command, config.backend or "triton"
    )
    (out / "recipe.json").write_text(json.dumps(config.to_dict(), indent=1, default=str))
    if console is not None:
        console.print(
            steps_table(
                reports, title=f"curation: {config.name} ({time.perf_counter() - started:.0f} s)"
            )
        )
        console.print(
            f"wrote {len(tasks)} tasks"
            + (f" and {len(sft)} SFT examples" if sft is not None else "")
            + f" to {out}"
        )
    return CurationResult(tasks, sft, reports, out, card)


def _run_steps(
    config: CurateConfig,
    steps: set[str],
    runner: _Steps,
    lazy: _LazyPool,
    generate: Generate | None,
    out: Path,
    console: Console | None,
) -> tuple[Dataset, Dataset | None]:
    """The recipe's steps in the module docstring's order: text-only first, then the ones
    that run code."""
    tasks = _text_steps(config, steps, runner, load_tasks(config.task_sources), out, console)
    if "validate" in steps:
        settings = validate_settings(config)
        journal = runner.journal("validate", settings)
        tasks = runner.run(
            "validate",
            tasks,
            settings,
            lambda data: validate_tasks(
                data, config.validate, console, journal, device=config.env_device, seed=config.seed
            ),
        )
    if "difficulty" in steps:
        tasks = _difficulty_step(config, runner, lazy, generate, tasks, console)
    sft = None
    if "sft" in steps and (config.sample_sources or config.trajectory_sources):
        runner.current = "sft"
        sft = _curate_sft(config, tasks, lazy, runner, out, console)
    return tasks, sft


def _text_steps(
    config: CurateConfig,
    steps: set[str],
    runner: _Steps,
    tasks: Dataset,
    out: Path,
    console: Console | None,
) -> Dataset:
    """normalize, dedup and decontaminate: they read the records' text and run none of it."""
    if "normalize" in steps:
        template = config.prompt_template
        settings = {
            "backend": config.backend,
            "template": Path(template).read_text()
            if template and Path(template).is_file()
            else template,
            "one_shot": config.one_shot,
        }
        tasks = runner.run(
            "normalize",
            tasks,
            settings,
            lambda data: normalize_tasks(
                data, config.backend, config.prompt_template, console, one_shot=config.one_shot
            ),
        )
    if "dedup" in steps:
        tasks = runner.run(
            "dedup", tasks, config.dedup, lambda data: dedup(data, config.dedup, console=console)
        )
        write_dedup_report(runner.reports[-1], out / "dedup.md")
    if "decontaminate" in steps and config.benchmark_sources:
        # Text-only and cheap, and its benchmark is read afresh: never checkpointed.
        runner.current = "decontaminate"
        benchmark = Benchmark.from_sources(config.benchmark_sources, config.decontaminate)
        tasks, report = decontaminate(tasks, benchmark, console=console)
        runner.reports.append(report)
        write_decontamination_report(report, out / "decontamination.md")
    return tasks


def _difficulty_step(
    config: CurateConfig,
    runner: _Steps,
    lazy: _LazyPool,
    generate: Generate | None,
    tasks: Dataset,
    console: Console | None,
) -> Dataset:
    """Difficulty tags; with a model, its pass rate too, journaled under the model's settings
    (a pool is started only then)."""
    difficulty = config.difficulty
    model = None
    if generate is not None:
        model = {
            **difficulty.model_settings(),
            "seed": config.seed,
            "eval_timeout_s": config.env_timeout_s,
            "device": config.env_device,
        }
    settings = {"config": difficulty, "model": model}
    journal = runner.journal("difficulty", {"k": difficulty.pass_rate_k, "model": model})
    return runner.run(
        "difficulty",
        tasks,
        settings,
        lambda data: tag_difficulty(
            data,
            difficulty,
            generate,
            lazy.get() if generate is not None else None,
            console,
            journal=journal if generate is not None else None,
        ),
    )


def validate_settings(config: CurateConfig) -> dict[str, Any]:
    """What keys validate's journal and checkpoint: the verdicts' settings and the device."""
    return {
        "config": config.validate.verdict_settings(config.env_device, config.seed),
        "device": resolve_device(config.env_device),
    }


def _evaluate_step(
    name: str,
    evaluate: Callable[..., tuple[Dataset, int]],
    tasks: Dataset,
    lazy: _LazyPool,
    console: Console | None,
) -> Callable[[Dataset], tuple[Dataset, StepReport]]:
    """A checkpointable step that fills missing EvalResults of records through the pool."""

    def step(records: Dataset) -> tuple[Dataset, StepReport]:
        report = StepReport(name, count_in=len(records))
        with timed(report):
            records, evaluated = (
                evaluate(records, tasks, lazy.get(), console) if len(records) else (records, 0)
            )
        report.count_out, report.notes["evaluated"] = len(records), evaluated
        log_step(report, console)
        return records, report

    return step


def _curate_sft(
    config: CurateConfig,
    tasks: Dataset,
    lazy: _LazyPool,
    runner: _Steps,
    out: Path,
    console: Console | None,
) -> Dataset:
    reports = runner.reports
    settings = {
        "tasks": dataset_fingerprint(tasks),
        # journal keys keep the names they were written with, so journals resume
        "device": config.env_device,
        "eval_timeout_s": config.env_timeout_s,
        "pool": config.env_pool,
    }
    parts = []
    if config.sample_sources:
        samples, report = attach_to_tasks(
            load_samples(config.sample_sources), tasks, "attach_samples", console
        )
        reports.append(report)
        samples = fill_prompts(samples, tasks, "samples")
        samples = runner.run(
            "evaluate_samples",
            samples,
            settings,
            _evaluate_step("evaluate_samples", evaluate_missing, tasks, lazy, console),
        )
        _save_parquet(samples, out / "evaluated" / "samples")
        parts.append(samples_to_sft(samples, tasks, config.sft.sft_reasoning_format))
    if config.trajectory_sources:
        trajectories, report = attach_to_tasks(
            load_trajectories(config.trajectory_sources), tasks, "attach_trajectories", console
        )
        reports.append(report)
        trajectories = fill_prompts(trajectories, tasks, "trajectories")
        trajectories = runner.run(
            "evaluate_turns",
            trajectories,
            settings,
            _evaluate_step("evaluate_turns", evaluate_missing_turns, tasks, lazy, console),
        )
        _save_parquet(trajectories, out / "evaluated" / "trajectories")
        revisions, report = trajectories_to_sft(
            trajectories, config.revision, config.sft.sft_reasoning_format, console
        )
        reports.append(report)
        parts.append(revisions)
    sft, report = select_sft(concat_sft(parts), config.sft, console)
    reports.append(report)
    return sft
