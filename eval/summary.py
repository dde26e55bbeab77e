"""A sweep's summary (what ``summary.json`` holds), built from its results folder alone.

The folder's ``samples.jsonl``, ``config.json`` and ``tasks.json`` (the selected tasks) are
all it needs, so a report can be rebuilt, or two runs compared (``compare``), long after the
sweep ran. The numbers come from ``metrics``; this module adds the run's metadata and the first
error of each kind. ``report`` renders the summary.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kernelrl.eval.estimators import StatsConfig
from kernelrl.eval.metrics import sweep_summary
from kernelrl.eval.records import (
    CONFIG_FILE,
    SAMPLES_FILE,
    TASKS_FILE,
    SampleRecord,
    SelectedTask,
    read_records,
    read_tasks,
)


def stats_config(config: dict[str, Any]) -> StatsConfig:
    samples = int(config.get("samples", 1))
    pass_ks = sorted(set(config.get("pass_k") or [1, samples]))
    return StatsConfig(
        pass_ks=pass_ks,
        confidence=float(config.get("confidence", 0.95)),
        bootstrap_samples=int(config.get("bootstrap_samples", 2000)),
        seed=int(config.get("seed", 0)),
    )


def load_selection(folder: str | Path) -> list[SelectedTask] | None:
    """The selected tasks of a results folder (None where it predates ``tasks.json``)."""
    return read_tasks(Path(folder) / TASKS_FILE)


def load_run(folder: str | Path) -> tuple[dict[str, Any], list[SampleRecord]]:
    folder = Path(folder)
    samples = folder / SAMPLES_FILE
    if not samples.exists():
        raise ValueError(f"{folder} is not a sweep results folder (no {SAMPLES_FILE})")
    config_path = folder / CONFIG_FILE
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    return config, read_records(samples)


def run_metadata(
    config: dict[str, Any],
    records: Sequence[SampleRecord],
    folder: Path,
    selection: Sequence[SelectedTask] | None = None,
) -> dict[str, Any]:
    results = [r.result for r in records]
    devices = Counter(r.device_name or r.device for r in results)
    versions = next((r.versions for r in results if r.versions), {})
    client = config.get("client", "")
    planned = [t.samples for t in selection or () if t.samples > 0]
    if not planned:  # folders written before tasks.json
        planned = list(Counter(r.task_id for r in records if r.turn == 0).values())
    return {
        "run_name": config.get("run_name") or folder.name,
        "folder": str(folder),
        "client": client,
        "model": served_model(config, records),
        # samples per task: the recipe's for a model; what the sources hold for fixed solutions
        "samples_range": [min(planned), max(planned)] if planned else None,
        "fixed_solutions": config.get("fixed_solutions") or [],
        "backend": config.get("backend", ""),
        "benchmark": config.get("benchmark", ""),
        "benchmark_path": config.get("benchmark_path", ""),
        "tasks": len({r.task_id for r in records} | {t.task_id for t in selection or ()}),
        "samples": config.get("samples"),
        "turns": config.get("max_turns", config.get("turns")),  # a folder of before: "turns"
        "temperature": config.get("temperature"),
        "max_tokens": config.get("max_tokens"),
        "attempts": len(records),
        "devices": dict(devices),
        "timing_meaningful": any(r.timing_meaningful for r in results),
        "versions": versions,
        "generated_at": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def served_model(config: dict[str, Any], records: Sequence[SampleRecord] = ()) -> str:
    """The model a run's completions came from: for an OpenAI-compatible endpoint the model the
    server reported (or was asked for) and its URL, else ``model_name_or_path``."""
    if config.get("client") == "openai":
        served = next((m for r in records if (m := r.extra.get("served_model"))), None)
        name = served or config.get("served_model_name") or "(the server's model)"
        return f"{name} @ {config.get('api_base', '')}".strip(" @")
    return config.get("model_name_or_path") or config.get("served_model_name") or ""


def build_summary(folder: str | Path) -> tuple[dict[str, Any], list[SampleRecord], dict[str, Any]]:
    folder = Path(folder)
    config, records = load_run(folder)
    selection = load_selection(folder)
    summary = sweep_summary(records, stats_config(config), selection)
    summary["run"] = run_metadata(config, records, folder, selection)
    summary["examples"] = first_errors(records)
    return summary, records, config


def first_errors(records: Sequence[SampleRecord], width: int = 160) -> dict[str, dict[str, Any]]:
    """One example per failure status (the first in task order), its error on one line."""
    examples: dict[str, dict[str, Any]] = {}
    for record in sorted(records, key=lambda r: (r.turn, r.task_id, r.sample)):
        status = str(record.result.status)
        if record.result.correct or status in examples:
            continue
        error = " ".join((record.result.error or record.result.feedback).split())
        examples[status] = {
            "task_id": record.task_id,
            "sample": record.sample,
            "turn": record.turn,
            "error": error[:width].replace("`", "'") + ("..." if len(error) > width else ""),
        }
    return dict(sorted(examples.items()))
