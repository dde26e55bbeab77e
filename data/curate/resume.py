"""Work kept across interruptions: finished steps on disk, per-record journals.

A curation run over a real corpus spends minutes to hours in its sandboxed steps; an
interrupted run must not start from scratch. Two mechanisms, both under the output folder's
``.curate_state/``:

- **Step checkpoints.** Each finished step's dataset and report are written atomically (a
  temporary folder renamed into place) under a fingerprint of its input and configuration
  (chained: a step's fingerprint covers every step before it). A rerun of the same command
  loads the checkpoints whose fingerprint matches and runs only the steps after them.
- **Record journals.** The expensive per-record steps (``validate``, pass rates in
  ``difficulty``) append each finished record's result to a JSONL journal keyed by
  (fingerprint of the step's configuration, task content hash). A rerun reads the journal and
  runs only the records without an entry; a record's result does not depend on the other
  records, so a changed earlier step (another dedup threshold) still reuses it. A line cut off
  by a kill is ignored.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from datasets import Dataset

from kernelrl.data.curate.report import StepReport

STATE_DIR = ".curate_state"


def fingerprint(*parts: Any) -> str:
    """A stable hash of JSON-able parts (dataclasses as dicts)."""
    plain = [asdict(p) if is_dataclass(p) and not isinstance(p, type) else p for p in parts]
    text = json.dumps(plain, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def dataset_fingerprint(dataset: Dataset) -> str:
    digest = hashlib.sha256()
    for row in dataset:
        digest.update(json.dumps(row, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


class Journal:
    """Append-only JSONL of per-record results of one step under one configuration."""

    def __init__(self, path: Path, config_fingerprint: str) -> None:
        self.path, self.config = path, config_fingerprint
        self.entries: dict[str, dict[str, Any]] = {}
        self.written = 0
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue  # the last line of a killed run
                if isinstance(entry, dict) and entry.get("config") == config_fingerprint:
                    self.entries[entry["task"]] = entry["result"]
        self.loaded = len(self.entries)

    def get(self, task_hash: str) -> dict[str, Any] | None:
        return self.entries.get(task_hash)

    def add(self, task_hash: str, record_id: str, result: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(
            {"config": self.config, "task": task_hash, "id": record_id, "result": result},
            sort_keys=True,
        )
        with open(self.path, "a") as out:
            out.write(line + "\n")
            out.flush()
        self.entries[task_hash] = result
        self.written += 1


class StepStore:
    """Checkpoints of finished steps under ``OUT/.curate_state/steps``."""

    def __init__(self, output_dir: Path) -> None:
        self.root = output_dir / STATE_DIR
        self.kept: list[str] = []  # steps finished and on disk (loaded or written) this run
        self.resumed: list[str] = []

    def journal(self, step: str, config_fingerprint: str) -> Journal:
        return Journal(self.root / "journals" / f"{step}.jsonl", config_fingerprint)

    def _folder(self, index: int, step: str) -> Path:
        return self.root / "steps" / f"{index:02d}_{step}"

    def load(self, index: int, step: str, key: str) -> tuple[Dataset, StepReport] | None:
        folder = self._folder(index, step)
        try:
            meta = json.loads((folder / "checkpoint.json").read_text())
            if meta["fingerprint"] != key:
                return None
            dataset = Dataset(pq.read_table(folder / "dataset.parquet"))
        except (OSError, ValueError, KeyError):
            return None
        self.kept.append(step)
        self.resumed.append(step)
        return dataset, StepReport.from_dict(meta["report"])

    def save(self, index: int, step: str, key: str, dataset: Dataset, report: StepReport) -> None:
        folder = self._folder(index, step)
        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        # Arrow's own Parquet writer: ``save_to_disk`` cannot read back an empty dataset.
        pq.write_table(dataset.flatten_indices().data.table, tmp / "dataset.parquet")
        (tmp / "checkpoint.json").write_text(
            json.dumps({"fingerprint": key, "report": report.to_dict()}, default=str)
        )
        old = folder.with_name(folder.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if folder.exists():
            os.replace(folder, old)
        os.replace(tmp, folder)
        shutil.rmtree(old, ignore_errors=True)
        self.kept.append(step)
