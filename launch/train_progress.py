"""Training progress: step/total, rate, an ETA that does not climb within a step, what the
current step is doing, and the last reward, as plain lines.

Why not TRL's ``RichProgressCallback`` or ``kernelrl.progress``'s bar: both estimate from the
rate of completed items, which falls while a step of several minutes is under way, so their
ETA climbed from 11 to 27 minutes within one step (and said "ETA unknown" for all of the first
one). ``PlainProgressCallback`` estimates from the mean duration of the steps this run has
completed and the time the current step has used: within a step the ETA only falls. Until a
step has ended it says what the step is doing instead (``step 1: generating turn 1 (4
samples)``: ``set_phase``, which the trainer's rollout calls). Lines come every
``KERNELRL_PROGRESS_INTERVAL`` seconds and at the end, on a terminal and in a log file alike.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from transformers import TrainerCallback

from kernelrl.progress import clock, interval_s, rate


def train_line(
    completed: int,
    total: int,
    elapsed_s: float,
    step_durations: list[float],
    in_step_s: float,
    phase: str = "",
    reward: float | None = None,
) -> str:
    """One progress line. ``step_durations``: the steps completed in this run (a resumed run
    counts its checkpoint's steps in ``completed``, not in the rate); ``in_step_s``: time spent
    in the step under way. ETA = what is left of the current step at the mean step duration,
    plus the mean for every step after it: it falls as the step goes on and is recomputed only
    when a step ends."""
    share = min(100, int(100 * completed / total)) if total else 0
    mean = sum(step_durations) / len(step_durations) if step_durations else None
    head = f"train: {completed}/{total} ({share}%) "
    head += rate(1 / mean) if mean else "no rate yet"
    if completed >= total:
        tail = f"done in {clock(elapsed_s)}"
    elif mean is None:
        tail = f"ETA after step {completed + 1}, elapsed {clock(elapsed_s)}"
    else:
        left = max(mean - in_step_s, 0.0) + (total - completed - 1) * mean
        tail = f"ETA {clock(left)}, elapsed {clock(elapsed_s)}"
    extra = f", step {completed + 1}: {phase}" if phase and completed < total else ""
    if reward is not None:
        extra += f", reward {reward:.4g}"
    return f"{head}, {tail}{extra}"


VERDICTS = (
    "correct",
    "incorrect",
    "runtime_error",
    "timeout",
    "compile_error",
    "format_error",
    "integrity_violation",
    "harness_error",
)


def step_line(step: int, total: int, logs: dict[str, Any]) -> str | None:
    """What a logged step did, in one line: its reward and the spread within groups (no
    spread, no advantage), the environment's verdicts over its turns, the advantages' size."""
    if not isinstance(logs.get("reward"), int | float):
        return None

    def share(key: str) -> str:
        value = logs.get(key)
        return f"{100 * value:.0f}%" if isinstance(value, int | float) else "-"

    verdicts = [f"{name} {share('env/' + name)}" for name in VERDICTS if logs.get("env/" + name)]
    parts = [
        f"step {step}/{total}: reward {logs['reward']:.3f}",
        f"std {logs.get('reward_std', float('nan')):.3f}",
        f"groups without spread {share('frac_reward_zero_std')}",
        "turns: " + (", ".join(verdicts) or "none judged"),
    ]
    if isinstance(logs.get("advantage/abs_mean"), int | float):
        parts.append(f"|advantage| {logs['advantage/abs_mean']:.3f}")
    return "; ".join(parts)


class PlainProgressCallback(TrainerCallback):
    """Prints ``train: 1/3 (33%) 0.7/min, ETA 0:02:50, elapsed 0:01:30, step 2: evaluating
    turn 1 (2/4 judged), reward 0.214`` (see ``train_line``)."""

    def __init__(self, console: Console, interval: float | None = None) -> None:
        self.console = console
        self.interval = interval if interval is not None else interval_s()
        self.total = 0
        self.completed = 0
        self.durations: list[float] = []
        self.phase = ""
        self.reward: float | None = None
        self._started = self._step_started = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def set_phase(self, phase: str) -> None:
        """What the current step is doing (called from the rollout, any thread)."""
        with self._lock:
            self.phase = phase

    def line(self) -> str:
        now = time.monotonic()
        with self._lock:
            return train_line(
                self.completed,
                self.total,
                now - self._started,
                list(self.durations),
                now - self._step_started,
                self.phase,
                self.reward,
            )

    def _print(self) -> None:
        self.console.print(self.line(), markup=False, highlight=False, soft_wrap=True)

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            self._print()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        self.total, self.completed = state.max_steps, state.global_step
        self._started = self._step_started = time.monotonic()
        self._thread = threading.Thread(target=self._tick, name="kernelrl-train", daemon=True)
        self._thread.start()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        with self._lock:
            self._step_started = time.monotonic()
            self.phase = ""

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        with self._lock:
            self.durations.append(time.monotonic() - self._step_started)
            self.completed = state.global_step
            self._step_started = time.monotonic()
            self.phase = ""

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if logs and isinstance(logs.get("reward"), int | float):
            with self._lock:
                self.reward = float(logs["reward"])
            if state.is_world_process_zero:
                line = step_line(state.global_step, state.max_steps, logs)
                self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self._print()


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


class PortableCheckpoints(TrainerCallback):
    """After every checkpoint: its adapter config and the run's model card name the base model
    as the recipe did (``launch.adapters.portable_adapter``), not this machine's cache path."""

    def __init__(self, base_name: str, local_base: str) -> None:
        self.base_name = base_name
        self.local_base = local_base

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        from kernelrl.launch.adapters import name_base_in_card, portable_adapter

        if state.is_world_process_zero:
            folder = Path(args.output_dir)
            checkpoint = folder / f"checkpoint-{state.global_step}"
            portable_adapter(checkpoint, self.base_name, self.local_base)
            name_base_in_card(folder / "README.md", self.base_name, self.local_base)


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
    """Periodic progress lines (on a terminal too: see the module docstring); with
    ``stop_after_s``, the wall-clock stop."""
    stop = [StopAfterSeconds(stop_after_s)] if stop_after_s else []
    return [PlainProgressCallback(console), *stop]
