"""Training progress in a log file: step/total, rate, ETA and the last reward as plain lines.

TRL's ``RichProgressCallback`` draws a live panel on a terminal, but on a pipe (a SLURM log,
``nohup``) rich prints nothing until training ends. ``train_callbacks`` keeps rich's panel on a
terminal and otherwise uses ``PlainProgressCallback``, which feeds ``kernelrl.progress`` (the
same lines as curate and eval, every ``KERNELRL_PROGRESS_INTERVAL`` seconds and at the end).
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from transformers import TrainerCallback

from kernelrl.progress import Progress


class PlainProgressCallback(TrainerCallback):
    """Prints ``train: 12/100 (12%) 1.3/min, ETA 1:07:41, elapsed 0:09:13, reward 0.214``."""

    def __init__(self, console: Console, interval: float | None = None) -> None:
        self.console = console
        self.interval = interval
        self.progress: Progress | None = None
        self.bar: Any = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        self.progress = Progress(self.console, interval=self.interval).__enter__()
        # A resumed run starts at its checkpoint's step; the rate counts this run's steps only.
        self.bar = self.progress.add_task(
            "train", total=state.max_steps, completed=state.global_step, reward=None
        )

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.progress is not None:
            self.progress.update(self.bar, completed=state.global_step)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if self.progress is not None and logs and isinstance(logs.get("reward"), int | float):
            self.progress.update(self.bar, reward=float(logs["reward"]))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.progress is not None:
            self.progress.__exit__(None, None, None)
            self.progress = None


class StopAfterSeconds(TrainerCallback):
    """Ends training with a checkpoint once a step ends ``seconds`` after training began, so
    a time-limited job stops at a step boundary instead of being killed mid-step (and losing
    every step since its last checkpoint)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started = time.monotonic()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.started = time.monotonic()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if on_any_rank(time.monotonic() - self.started >= self.seconds):
            control.should_save = True
            control.should_training_stop = True


def on_any_rank(flag: bool) -> bool:
    """``flag`` of any trainer process, on every process: ranks whose clocks fall on either
    side of a limit must stop at the same step, or those going on wait forever for the others
    at their next collective."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    flags: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(flags, flag)
    return any(flags)


def train_callbacks(console: Console, stop_after_s: float | None = None) -> list[TrainerCallback]:
    """rich's panel on a terminal; periodic plain lines when stderr goes to a file or pipe;
    with ``stop_after_s``, the wall-clock stop."""
    stop = [StopAfterSeconds(stop_after_s)] if stop_after_s else []
    if console.is_terminal:
        from trl.trainer.callbacks import RichProgressCallback

        return [RichProgressCallback(), *stop]
    return [PlainProgressCallback(console), *stop]
