"""The timing-spread benchmark's ways that need care off the GPU: solution and reference timed set
by set in the order the evaluator interleaves them, and the local memory moved before a set."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import timing_spread  # noqa: E402

from kernelrl.env import timing  # noqa: E402


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


class FakeDriver:
    """libcuda's two limit calls as the way uses them: the stack limit read, then raised."""

    def __init__(self, stack_bytes: int) -> None:
        self.stack_bytes, self.calls = stack_bytes, []

    def cuCtxGetLimit(self, value, which: int) -> int:  # noqa: N802 - the driver's name
        self.calls.append(("get", which))
        value._obj.value = self.stack_bytes
        return 0

    def cuCtxSetLimit(self, which: int, value) -> int:  # noqa: N802 - the driver's name
        self.calls.append(("set", which, value.value))
        self.stack_bytes = value.value
        return 0


def test_the_local_memory_way_keeps_new_memory_then_raises_the_stack_limit(monkeypatch) -> None:
    driver, events = FakeDriver(1024), []
    monkeypatch.setattr(ctypes, "CDLL", lambda name: driver)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append("empty_cache"))

    def empty(nbytes: int, dtype, device: str) -> torch.Tensor:
        events.append(("block", nbytes, device))
        return torch.zeros(0)

    monkeypatch.setattr(torch, "empty", empty)
    kept: list = []
    for index in range(2):
        timing_spread.local_memory_moved(index, kept)
    assert events == [
        "empty_cache",
        ("block", 1 << 24, "cuda"),
        "empty_cache",
        ("block", 2 << 24, "cuda"),
    ]
    assert len(kept) == 2
    assert driver.calls == [("get", 0), ("set", 0, 1040), ("get", 0), ("set", 0, 1056)]
