"""Training progress a newcomer can read: an ETA that does not climb within a step, what the
step under way is doing, a line per logged step, and start-up stages before the first step.

A step of the CPU smoke run takes minutes; an ETA from the rate of completed steps climbed
from 11 to 27 minutes within one of them, and the first five minutes printed only "0/3 no rate
yet, ETA unknown". These tests drive the callback and the formatting with made-up clocks."""

from __future__ import annotations

import io
import re
import time
from types import SimpleNamespace

from rich.console import Console

from kernelrl.launch.train_progress import (
    PlainProgressCallback,
    step_line,
    train_callbacks,
    train_line,
)
from kernelrl.progress import Stages


def eta_seconds(line: str) -> int:
    h, m, s = re.search(r"ETA (\d+):(\d\d):(\d\d)", line).groups()
    return int(h) * 3600 + int(m) * 60 + int(s)


def test_eta_falls_within_a_step_and_is_recomputed_when_it_ends() -> None:
    # two steps of 120 s done out of 5: the third is under way
    done = [120.0, 120.0]
    etas = [eta_seconds(train_line(2, 5, 240 + t, done, t)) for t in range(0, 400, 20)]
    assert etas[0] == 120 + 2 * 120  # the rest of this step, then two more
    assert all(b <= a for a, b in zip(etas, etas[1:], strict=False))  # never climbs in a step
    assert etas[-1] == 2 * 120  # an overrunning step counts as done, not as negative time
    # the rate of completed steps (the old estimate) would have climbed as the step went on
    old = [(5 - 2) / (2 / (240 + t)) for t in range(0, 400, 20)]
    assert old[-1] > old[0]


def test_first_step_says_what_it_does_instead_of_eta_unknown() -> None:
    line = train_line(0, 3, 75.0, [], 75.0, "evaluating turn 1 (2/4 judged)")
    assert line == (
        "train: 0/3 (0%) no rate yet, ETA after step 1, elapsed 0:01:15, "
        "step 1: evaluating turn 1 (2/4 judged)"
    )
    finished = train_line(3, 3, 400.0, [130.0, 130.0, 140.0], 0.0, "x", reward=0.25)
    assert finished == "train: 3/3 (100%) 27.0/h, done in 0:06:40, reward 0.25"


def test_a_logged_step_is_one_line_with_spread_and_verdicts() -> None:
    logs = {
        "reward": 0.6125,
        "reward_std": 0.52,
        "frac_reward_zero_std": 0.25,
        "env/correct": 0.5,
        "env/format_error": 0.25,
        "env/incorrect": 0.25,
        "env/compile_error": 0.0,
        "advantage/abs_mean": 0.41,
    }
    assert step_line(2, 3, logs) == (
        "step 2/3: reward 0.613; std 0.520; groups without spread 25%; "
        "turns: correct 50%, incorrect 25%, format_error 25%; |advantage| 0.410"
    )
    assert step_line(2, 3, {"loss": 0.1}) is None  # not a training step's log


def test_callback_lines_carry_the_phase_and_reward() -> None:
    log = io.StringIO()
    console = Console(file=log, force_terminal=True, width=300)
    (callback,) = train_callbacks(console)  # on a terminal too: rich's ETA climbs as well
    assert isinstance(callback, PlainProgressCallback)
    callback.interval = 0.05
    state = SimpleNamespace(is_world_process_zero=True, max_steps=2, global_step=0)
    callback.on_train_begin(None, state, None)
    callback.on_step_begin(None, state, None)
    callback.set_phase("generating turn 1 (4 samples)")
    time.sleep(0.2)
    state.global_step = 1
    callback.on_step_end(None, state, None)
    callback.on_log(None, state, None, logs={"reward": 0.5, "reward_std": 0.1})
    callback.on_step_begin(None, state, None)
    time.sleep(0.2)
    state.global_step = 2
    callback.on_step_end(None, state, None)
    callback.on_train_end(None, state, None)
    text = log.getvalue()
    assert "step 1: generating turn 1 (4 samples)" in text
    assert re.search(r"^train: 1/2 \(50%\) .*, ETA \d+:\d\d:\d\d, .*reward 0\.5$", text, re.M)
    assert re.search(r"^step 1/2: reward 0\.500; std 0\.100", text, re.M)
    assert text.rstrip().splitlines()[-1].startswith("train: 2/2 (100%)")


def test_start_up_stages_are_announced_and_timed() -> None:
    log = io.StringIO()
    console = Console(file=log, force_terminal=False, width=300)
    with Stages(console, "start-up", interval=0.05) as stages:
        stages.begin("policy, vLLM engine and environment pool")
        time.sleep(0.2)
    lines = log.getvalue().splitlines()
    assert lines[0] == "start-up: policy, vLLM engine and environment pool ..."
    assert any(
        re.fullmatch(r"start-up: policy, vLLM engine and environment pool, elapsed 0:00:00", x)
        for x in lines
    )
    assert re.fullmatch(r"start-up: ready in \d+:\d\d:\d\d", lines[-1])
    failed = io.StringIO()
    try:
        with Stages(Console(file=failed), "start-up", interval=10) as stages:
            stages.begin("model x")
            raise ValueError("boom")
    except ValueError:
        pass
    assert "start-up: stopped during model x" in failed.getvalue()
