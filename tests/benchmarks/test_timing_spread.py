"""The timing-spread benchmark's ways that need care off the GPU: solution and reference timed set
by set in the order the evaluator interleaves them, and the local memory moved before a set."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import timing_spread  # noqa: E402

from kernelrl.env import timing  # noqa: E402
from kernelrl.env.sandbox import local_memory  # noqa: E402


class Recorder(torch.nn.Module):
    """A model that notes its name and the input set it ran on."""

    def __init__(self, name: str, calls: list) -> None:
        super().__init__()
        self.name, self.calls = name, calls

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append((self.name, int(x.item())))
        return x


def test_the_interleaved_way_times_each_set_for_the_solution_then_the_reference(
    monkeypatch,
) -> None:
    calls: list = []
    models = {"ref": Recorder("ref", calls), "sol": Recorder("sol", calls)}
    inputs = [[torch.tensor(float(i))] for i in range(3)]

    def fake_time_cuda(call, config):
        call()  # one call stands for a timing; its median says which model and set it timed
        name, index = calls[-1]
        return SimpleNamespace(median_ms=(10.0 if name == "sol" else 20.0) + index)

    monkeypatch.setattr(timing, "time_cuda", fake_time_cuda)
    medians = timing_spread.interleaved_medians(models, inputs, config=None)
    assert calls == [("sol", 0), ("ref", 0), ("sol", 1), ("ref", 1), ("sol", 2), ("ref", 2)]
    assert medians == {"sol": [10.0, 11.0, 12.0], "ref": [20.0, 21.0, 22.0]}


def test_the_local_memory_way_moves_it_before_every_set_past_a_growing_block(monkeypatch) -> None:
    moves: list = []

    def move(kept: list, spacer_bytes: int) -> None:
        moves.append((spacer_bytes, len(kept)))
        kept.append(spacer_bytes)

    def fake_time_cuda(call, config, prepare=None):
        call()
        return SimpleNamespace(median_ms=float(len(moves)))

    monkeypatch.setattr(local_memory, "move_local_memory", move)
    monkeypatch.setattr(timing, "time_cuda", fake_time_cuda)
    calls: list = []
    inputs = [[torch.tensor(float(i))] for i in range(3)]
    medians = timing_spread.placed_medians(Recorder("sol", calls), inputs, "l", None, None)
    assert moves == [(1 << 24, 0), (2 << 24, 1), (3 << 24, 2)]
    assert calls == [("sol", 0), ("sol", 1), ("sol", 2)]
    assert medians == [1.0, 2.0, 3.0]
