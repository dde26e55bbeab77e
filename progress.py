"""Progress of long steps that a person can follow on a terminal and in a log file alike.

On a terminal this is rich's progress bar. When the console is not a terminal (a SLURM log,
``nohup``, a pipe) rich's live display prints nothing until the step ends, so a job looks dead
for many minutes; there a background thread prints one plain line per step every
``interval_s`` seconds and once at the end::

    validate: 120/250 (48%) 2.3/s, ETA 0:00:56, elapsed 0:00:52

The interval comes from ``KERNELRL_PROGRESS_INTERVAL`` (seconds; 30 by default), so every command
(curate, eval, env check-suite, train) is tuned the same way. This module imports nothing from
kernelrl: every layer, ``env`` included, may use it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Iterator
from datetime import timedelta
from types import TracebackType
from typing import Any, TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as RichProgress

__all__ = ["INTERVAL_ENV", "Progress", "Stages", "clock", "interval_s", "plain_line", "rate"]

INTERVAL_ENV = "KERNELRL_PROGRESS_INTERVAL"
DEFAULT_INTERVAL_S = 30.0

T = TypeVar("T")


def interval_s() -> float:
    """Seconds between plain progress lines: ``KERNELRL_PROGRESS_INTERVAL`` or 30."""
    raw = os.environ.get(INTERVAL_ENV, "")
    try:
        value = float(raw) if raw else DEFAULT_INTERVAL_S
    except ValueError:
        raise ValueError(f"{INTERVAL_ENV}={raw!r} is not a number of seconds") from None
    if value <= 0:
        raise ValueError(f"{INTERVAL_ENV}={raw!r} must be a positive number of seconds")
    return value


def default_columns() -> tuple[ProgressColumn, ...]:
    """The bar every kernelrl command shows on a terminal."""
    return (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    )


def clock(seconds: float) -> str:
    """``h:mm:ss`` of a duration (negative durations are 0)."""
    return str(timedelta(seconds=int(max(0.0, seconds))))


def rate(per_second: float) -> str:
    """Slow steps (a few validations a minute) read better per minute or hour than as 0.0/s."""
    if per_second >= 1:
        return f"{per_second:.1f}/s"
    if per_second * 60 >= 1:
        return f"{per_second * 60:.1f}/min"
    return f"{per_second * 3600:.1f}/h"


def _count(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"


def plain_line(
    description: str,
    completed: float,
    total: float | None,
    elapsed_s: float,
    done_here: float,
    fields: dict[str, Any] | None = None,
) -> str:
    """One progress line. The rate is the average since the step started in this process
    (``done_here`` items in ``elapsed_s``), not rich's 30-second window, which has no sample at
    all when one item takes longer than that; resumed items count in done/total, not the rate."""
    speed = done_here / elapsed_s if elapsed_s > 0 and done_here > 0 else None
    rate_text = rate(speed) if speed is not None else "no rate yet"
    if total:
        share = min(100, int(100 * completed / total))
        head = f"{description}: {_count(completed)}/{_count(total)} ({share}%) {rate_text}"
        if completed >= total:
            tail = f"done in {clock(elapsed_s)}"
        else:
            eta = clock((total - completed) / speed) if speed else "unknown"
            tail = f"ETA {eta}, elapsed {clock(elapsed_s)}"
    else:
        head = f"{description}: {_count(completed)} done, {rate_text}"
        tail = f"elapsed {clock(elapsed_s)}"
    extra = "".join(
        f", {key} {value:.4g}" if isinstance(value, float) else f", {key} {value}"
        for key, value in (fields or {}).items()
        if value is not None
    )
    return f"{head}, {tail}{extra}"


class Progress:
    """rich's ``Progress`` on a terminal; plain periodic lines elsewhere; nothing without a console.

    Use it like rich's: ``with Progress(console) as p: bar = p.add_task("validate", total=n)``,
    then ``p.advance(bar)`` (safe from worker threads). Extra keyword fields of ``add_task`` and
    ``update`` (a training run's last reward) are appended to the plain lines.
    """

    def __init__(
        self,
        console: Console | None,
        *,
        interval: float | None = None,
        columns: tuple[ProgressColumn, ...] | None = None,
    ) -> None:
        self.console = console
        self.plain = console is not None and not console.is_terminal
        self.interval = interval if interval is not None else interval_s()
        self._rich = RichProgress(
            *(columns or default_columns()),
            console=console,
            disable=console is None or self.plain,
            transient=False,
        )
        self._started: dict[TaskID, tuple[float, float]] = {}  # task -> (clock, completed)
        self._reported: set[TaskID] = set()  # finished tasks whose last line is printed
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ context
    def __enter__(self) -> Progress:
        self._rich.__enter__()
        if self.plain:
            self._thread = threading.Thread(
                target=self._tick, name="kernelrl-progress", daemon=True
            )
            self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._print_lines(final=True)
        self._rich.__exit__(kind, error, trace)

    # ------------------------------------------------------------------ tasks
    def add_task(
        self, description: str, total: float | None, completed: float = 0, **fields: Any
    ) -> TaskID:
        task = self._rich.add_task(description, total=total, completed=completed, **fields)
        self._started[task] = (time.monotonic(), completed)
        return task

    def advance(self, task: TaskID, amount: float = 1) -> None:
        self._rich.advance(task, amount)

    def update(
        self,
        task: TaskID,
        *,
        total: float | None = None,
        completed: float | None = None,
        description: str | None = None,
        **fields: Any,
    ) -> None:
        self._rich.update(task, total=total, completed=completed, description=description, **fields)

    def completed(self, task: TaskID) -> float:
        return self._rich.tasks[task].completed

    def track(self, items: Iterable[T], task: TaskID) -> Iterator[T]:
        """Yield ``items``, advancing ``task`` as each is finished with (also on ``continue``)."""
        for item in items:
            yield item
            self.advance(task)

    # ------------------------------------------------------------------ plain lines
    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            self._print_lines(final=False)

    def _print_lines(self, final: bool) -> None:
        assert self.console is not None
        now = time.monotonic()
        with self._lock:
            for task in self._rich.tasks:
                # A finished step gets its last line once, not one every interval after.
                finished = task.total is not None and task.completed >= task.total
                if task.id in self._reported and (finished or final):
                    continue
                if finished or final:
                    self._reported.add(task.id)
                else:
                    self._reported.discard(task.id)  # its total grew again
                self.console.print(
                    self._line(task, now), markup=False, highlight=False, soft_wrap=True
                )

    def _line(self, task: Task, now: float) -> str:
        started, initial = self._started.get(task.id, (now, 0.0))
        return plain_line(
            task.description,
            task.completed,
            task.total,
            now - started,
            task.completed - initial,
            task.fields,
        )


class Stages:
    """Named stages of a start-up, for the minutes before a progress bar exists (a model
    loads, an inference engine starts, sandboxes are forked) when a job would otherwise look
    dead: a line as each stage begins, one every ``interval`` seconds while it lasts (on a
    terminal too: the libraries' own start-up logs run in between), and one at the end::

        start-up: policy model, vLLM engine and environment pool ...
        start-up: policy model, vLLM engine and environment pool, elapsed 0:00:30
        start-up: ready in 0:01:12

    Use as ``with Stages(console, "start-up") as stages: stages.begin("model"); ...``.
    """

    def __init__(self, console: Console, name: str, *, interval: float | None = None) -> None:
        self.console = console
        self.name = name
        self.interval = interval if interval is not None else interval_s()
        self.stage = ""
        self._started = time.monotonic()
        self._stage_started = self._started
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> Stages:
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._tick, name="kernelrl-stages", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        elapsed = clock(time.monotonic() - self._started)
        if kind is None:
            self._print(f"{self.name}: ready in {elapsed}")
        else:
            self._print(f"{self.name}: stopped during {self.stage or 'start-up'} after {elapsed}")

    def begin(self, stage: str) -> None:
        """A new stage starts now (the previous one, if any, is done)."""
        with self._lock:
            self.stage = stage
            self._stage_started = time.monotonic()
        self._print(f"{self.name}: {stage} ...")

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                stage, since = self.stage, self._stage_started
            if stage:
                self._print(f"{self.name}: {stage}, elapsed {clock(time.monotonic() - since)}")

    def _print(self, line: str) -> None:
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)
