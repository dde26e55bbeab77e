"""Step reports: counts in and out, and why each removed record went."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from rich.progress import TaskID
from rich.table import Table

from kernelrl.progress import Progress

T = TypeVar("T")


@dataclass
class Removal:
    id: str
    reason: str  # a short machine-readable word: duplicate, contaminated, reference_crashes, ...
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepReport:
    step: str
    count_in: int = 0
    count_out: int = 0
    seconds: float = 0.0
    removed: list[Removal] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)

    def remove(self, record_id: str, reason: str, detail: str = "", **data: Any) -> None:
        self.removed.append(Removal(record_id, reason, detail, data))

    @property
    def reasons(self) -> Counter[str]:
        return Counter(r.reason for r in self.removed)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["reasons"] = dict(self.reasons)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepReport:
        """The inverse of ``to_dict`` (a resumed run reads finished steps' reports back)."""
        fields = {k: v for k, v in data.items() if k != "reasons"}
        fields["removed"] = [Removal(**r) for r in data.get("removed", [])]
        return cls(**fields)


@contextmanager
def timed(report: StepReport) -> Iterator[StepReport]:
    started = time.perf_counter()
    try:
        yield report
    finally:
        report.seconds = time.perf_counter() - started


def steps_table(reports: list[StepReport], title: str = "curation steps") -> Table:
    table = Table(title=title)
    for column in ("step", "in", "out", "removed", "why", "seconds"):
        table.add_column(
            column, justify="right" if column in ("in", "out", "removed", "seconds") else "left"
        )
    for r in reports:
        why = ", ".join(f"{reason} x{n}" for reason, n in sorted(r.reasons.items())) or "-"
        table.add_row(
            r.step, str(r.count_in), str(r.count_out), str(len(r.removed)), why, f"{r.seconds:.1f}"
        )
    return table


class StepProgress:
    """The progress of one curation step; ``advance`` as records finish, ``track`` to iterate."""

    def __init__(self, progress: Progress, bar: TaskID) -> None:
        self.progress, self.bar = progress, bar

    def advance(self, amount: int = 1) -> None:
        self.progress.advance(self.bar, amount)

    def track(self, items: Iterable[T]) -> Iterator[T]:
        return self.progress.track(items, self.bar)


@contextmanager
def step_progress(
    console: Console | None, description: str, total: int, completed: int = 0
) -> Iterator[StepProgress]:
    """A bar on ``console`` (the CLI's stderr console, like ``kernelrl eval``), or periodic
    plain lines when it is not a terminal (``kernelrl.progress``); nothing without a console.
    ``completed`` counts records resumed from a journal."""
    with Progress(console) as progress:
        bar = progress.add_task(description, total=total, completed=completed)
        yield StepProgress(progress, bar)


def log_step(report: StepReport, console: Console | None) -> None:
    if console is not None:
        console.print(steps_table([report], title=f"step: {report.step}"))


def write_reports(reports: list[StepReport], folder: Path) -> None:
    """steps.json (counts) and removed.jsonl (one line per removed record) under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "steps.json").write_text(json.dumps([r.to_dict() for r in reports], indent=1))
    with open(folder / "removed.jsonl", "w") as out:
        for r in reports:
            for removal in r.removed:
                out.write(json.dumps({"step": r.step, **asdict(removal)}, sort_keys=True) + "\n")
