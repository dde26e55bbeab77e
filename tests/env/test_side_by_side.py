"""The reference's turns between the solution's input sets (env/side_by_side.py), on a real
reference timed on the CPU; the evaluator's use of them: tests/env/test_evaluator.py (CPU) and
tests/env/test_gpu.py (four sets on a GPU)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from kernelrl.env.gpu_claim import Sharing
from kernelrl.env.reference import ReferenceRunner
from kernelrl.env.side_by_side import InterleavedReference
from kernelrl.env.task import load_task
from kernelrl.env.timing import TimingConfig

ROOT = Path(__file__).resolve().parents[2]
RELU_TASK = load_task(ROOT / "data" / "tasks" / "01_relu.py")


def _interleaved(sharings: list[Sharing], count: int = 2) -> tuple[InterleavedReference, list]:
    """A reference whose turns find the GPU shared as ``sharings`` says, turn by turn."""
    timer = ReferenceRunner(torch.device("cpu")).timers(RELU_TASK, TimingConfig(), ("eager",))[
        "eager"
    ]
    asked = []

    @contextlib.contextmanager
    def alone() -> Iterator[Sharing]:
        asked.append(len(asked))
        yield sharings[len(asked) - 1]

    return InterleavedReference(timer, None, alone, count), asked


def test_every_turn_is_timed_alone_and_averaged() -> None:
    side_by_side, asked = _interleaved([Sharing(), Sharing()])
    side_by_side.take_turn(0)
    side_by_side.take_turn(1)
    eager, compiled, sharing = side_by_side.stats()
    assert asked == [0, 1] and sharing.alone and compiled is None
    assert eager is not None and eager.reps == sum(t.reps for t in side_by_side.turns["eager"])
    assert side_by_side.seconds > 0


def test_a_turn_not_alone_leaves_the_reference_untimed_and_stops_the_turns() -> None:
    side_by_side, asked = _interleaved([Sharing(unknown="busy"), Sharing()])
    side_by_side.take_turn(0)
    side_by_side.take_turn(1)  # taken, but not timed: the evaluation's timing is unused anyway
    eager, _, sharing = side_by_side.stats()
    assert eager is None and sharing.unknown == "busy" and asked == [0]


@pytest.mark.parametrize("turns", [[1], [0, 0], [0, 1, 2], ["0"]])
def test_turns_out_of_order_or_beyond_the_sets_asked_are_refused(turns: list) -> None:
    """The child's word decides nothing here: a set reported out of turn, twice, or beyond the
    sets it was asked to time is an unreadable report (the evaluator's ``runtime_error``)."""
    side_by_side, _ = _interleaved([Sharing()] * 3)
    with pytest.raises(ValueError, match="out of turn"):
        for index in turns:
            side_by_side.take_turn(index)


def test_no_turn_no_reference_timing() -> None:
    """A child that reports its timing without a turn between its sets leaves its speed-up
    unmeasured, never measured against some other reference."""
    side_by_side, asked = _interleaved([Sharing()])
    eager, compiled, sharing = side_by_side.stats()
    assert eager is None and compiled is None and sharing.alone and asked == []
