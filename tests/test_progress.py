"""Long steps show progress in a log file, not only on a terminal.

rich's live bar prints nothing on a pipe until the step ends: curation's validate of
KernelBench levels 2-3 showed no line in 330 s in a SLURM log. ``kernelrl.progress`` prints
``step: done/total (pct) rate, ETA ..., elapsed ...`` every ``KERNELRL_PROGRESS_INTERVAL``
seconds when the console is not a terminal; these tests run curate's step progress with stderr
to a pipe, a sweep with a slow pool, and the training callback, with a short interval."""

from __future__ import annotations

import errno
import io
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from kernelrl.data.bundled import SOLUTIONS_DIR
from kernelrl.env.result import EvalResult, Status
from kernelrl.eval.config import EvalSweepConfig
from kernelrl.eval.fixed import FixedSolutions
from kernelrl.eval.records import write_fix
from kernelrl.eval.sweep import Sweep
from kernelrl.launch.eval_cli import load_tasks
from kernelrl.progress import INTERVAL_ENV, Progress, plain_line

REPO = Path(__file__).resolve().parents[1]
CLOCK = r"\d+:\d\d:\d\d"
RATE = r"[\d.]+/(s|min|h)"


def running_lines(text: str, step: str, total: int) -> list[int]:
    """The done counts of the periodic (not final) lines of ``step`` that carry rate and ETA."""
    pattern = re.compile(
        rf"^{re.escape(step)}: (\d+)/{total} \(\d+%\) {RATE}, ETA {CLOCK}, elapsed {CLOCK}"
    )
    return [int(m.group(1)) for line in text.splitlines() if (m := pattern.match(line))]


def test_plain_line_says_done_total_rate_and_eta() -> None:
    line = plain_line("validate", 120, 250, 52.0, 120)
    assert line == "validate: 120/250 (48%) 2.3/s, ETA 0:00:56, elapsed 0:00:52"
    # resumed records count in done/total, not in the rate; slow steps per minute
    line = plain_line("validate", 60, 100, 120.0, 10)
    assert line == "validate: 60/100 (60%) 5.0/min, ETA 0:08:00, elapsed 0:02:00"
    assert plain_line("train", 4, 4, 65.0, 4, {"reward": 0.25}) == (
        "train: 4/4 (100%) 3.7/min, done in 0:01:05, reward 0.25"
    )
    assert plain_line("evaluate", 0, 9, 3.0, 0).endswith(
        "no rate yet, ETA unknown, elapsed 0:00:03"
    )


def test_curate_step_to_a_pipe_prints_periodic_lines() -> None:
    """A curate step (the ``step_progress`` that validate, pass rate and the SFT evaluations
    use) in a process whose stderr is a pipe, as under SLURM or nohup."""
    script = (
        "import time\n"
        "from rich.console import Console\n"
        "from kernelrl.data.curate.report import step_progress\n"
        "with step_progress(Console(stderr=True), 'validate', 10) as progress:\n"
        "    for _ in range(10):\n"
        "        time.sleep(0.1)\n"
        "        progress.advance()\n"
    )
    env = {**os.environ, INTERVAL_ENV: "0.1"}
    env.pop("FORCE_COLOR", None)
    env.pop("TTY_COMPATIBLE", None)
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    done = running_lines(proc.stderr, "validate", 10)
    assert len(set(done)) >= 2, proc.stderr  # lines while it runs, as it advances
    assert done == sorted(done)
    last = proc.stderr.strip().splitlines()[-1]
    assert re.fullmatch(rf"validate: 10/10 \(100%\) {RATE}, done in {CLOCK}", last), proc.stderr
    assert "\x1b" not in proc.stderr  # plain text, no terminal control codes


def test_a_terminal_keeps_the_rich_bar() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    with Progress(console, interval=0.01) as progress:
        bar = progress.add_task("validate", total=3)
        for _ in range(3):
            time.sleep(0.02)
            progress.advance(bar)
    assert not progress.plain
    assert "━" in out.getvalue() and "3/3" in out.getvalue()
    assert running_lines(out.getvalue(), "validate", 3) == []


class SlowPool:
    """Pool contract; every evaluation takes ``seconds`` (on its own thread)."""

    num_slots = 2

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def submit(self, tasks: list, solutions: list[str]) -> list[Future]:
        futures: list[Future] = []
        for task in tasks:
            future: Future = Future()
            verdict = EvalResult(
                task_id=task.id,
                backend=task.backend,
                status=Status.CORRECT,
                feedback="ok",
                timing_meaningful=False,
            )
            timer = threading.Timer(self.seconds * (len(futures) + 1), future.set_result, [verdict])
            timer.daemon = True
            timer.start()
            futures.append(future)
        return futures

    def close(self) -> None:
        return None


def test_sweep_to_a_file_prints_periodic_evaluate_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(INTERVAL_ENV, "0.1")
    config = EvalSweepConfig(
        output_dir=str(tmp_path / "run"),
        client="fixed",
        fixed_solutions=[str(SOLUTIONS_DIR / "triton")],
        task_regex="^(01_relu|02_gelu_tanh|06_row_sum)$",
        env_device="cpu",
        pass_k=[1],
    )
    tasks = load_tasks(config)
    client = FixedSolutions(config.fixed_solutions, [t.id for t in tasks])
    log = io.StringIO()
    console = Console(file=log, force_terminal=False, width=200)
    outcome = Sweep(config, tasks, client, SlowPool(0.25), console).run()
    total = len(outcome.records)
    assert total >= 3
    text = log.getvalue()
    assert running_lines(text, "evaluate (turn 1)", total), text
    assert re.search(rf"^generate \(turn 1\): {total}/{total} \(100%\) .*done in", text, re.M)
    assert re.search(rf"^evaluate \(turn 1\): {total}/{total} \(100%\) .*done in", text, re.M)


def test_training_callback_prints_step_rate_eta_and_reward() -> None:
    from kernelrl.launch.train_progress import PlainProgressCallback, train_callbacks

    log = io.StringIO()
    console = Console(file=log, force_terminal=False, width=200)
    assert [type(c) for c in train_callbacks(console)] == [PlainProgressCallback]
    callback = PlainProgressCallback(console, interval=0.05)
    state = SimpleNamespace(is_world_process_zero=True, max_steps=4, global_step=0)
    callback.on_train_begin(None, state, None)
    for step in range(1, 5):
        time.sleep(0.15)
        state.global_step = step
        callback.on_step_end(None, state, None)
        callback.on_log(None, state, None, logs={"reward": step / 10, "loss": 0.0})
    callback.on_train_end(None, state, None)
    text = log.getvalue()
    assert running_lines(text, "train", 4), text
    assert re.search(r"^train: [123]/4 .*ETA .*, reward 0\.[123]$", text, re.M), text
    assert re.search(r"^train: 4/4 \(100%\) .*done in .*, reward 0\.4$", text, re.M), text


@pytest.mark.parametrize(
    ("code", "fix"),
    [
        (errno.ENOSPC, "free some space"),
        (errno.EDQUOT, "free some space"),
        (errno.EROFS, "make /out writable"),
        (errno.EACCES, "make /out writable"),
        (errno.EIO, "fix what stops writes to /out"),
    ],
)
def test_only_a_full_disk_asks_for_space(code: int, fix: str) -> None:
    assert write_fix(OSError(code, os.strerror(code)), "/out") == fix
