"""Timing over several placements: how their summaries combine, and what each device times."""

from __future__ import annotations

import math
import types

import pytest
import torch

from kernelrl.env.result import TimingStats
from kernelrl.env.sandbox import harness
from kernelrl.env.timing import TimingConfig, average, placements, time_fn


def test_placements_average_their_medians_and_errors() -> None:
    runs = [
        TimingStats(1.0, 0.9, 1.1, 0.8, 1.5, 30, 0.01),
        TimingStats(1.2, 1.1, 1.3, 1.0, 1.4, 50, 0.02),
    ]
    combined = average(runs)
    assert combined.median_ms == pytest.approx(1.1)
    assert (combined.p25_ms, combined.p75_ms) == (pytest.approx(1.0), pytest.approx(1.2))
    assert (combined.min_ms, combined.max_ms, combined.reps) == (0.8, 1.5, 80)
    # Standard error of a mean of two medians: sqrt(0.01^2 + 0.024^2) / 2, relative to 1.1.
    assert combined.rel_err == pytest.approx(math.hypot(0.01, 0.024) / 2 / 1.1)


def test_only_a_gpu_times_several_placements() -> None:
    config = TimingConfig(placements=3)
    assert placements(torch.device("cuda"), config) == 3
    assert placements(torch.device("cpu"), config) == 1
    assert config.fingerprint() != TimingConfig(placements=1).fingerprint()

    calls = [0, 0]

    def first() -> None:
        calls[0] += 1

    def second() -> None:
        calls[1] += 1

    stats = time_fn([first, second], torch.device("cpu"), config)
    assert calls[0] == stats.reps + 1 and calls[1] == 0  # warm-up call + timed ones


@pytest.mark.gpu
def test_a_gpu_times_every_placement() -> None:
    x = torch.randn(1 << 20, device="cuda")
    counts = [0, 0, 0]

    def call_for(index: int):
        def call() -> None:
            counts[index] += 1
            x.mul(2.0)

        return call

    config = TimingConfig(placements=3)
    stats = time_fn([call_for(i) for i in range(3)], torch.device("cuda"), config)
    assert all(count >= config.min_reps for count in counts)
    assert stats.reps >= 3 * config.min_reps


def test_a_task_too_large_for_more_placements_is_timed_on_fewer() -> None:
    module = types.ModuleType("large_task")
    made = []

    def get_inputs() -> list[torch.Tensor]:
        if len(made) == 2:  # the GPU has room for two sets only
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        made.append(torch.randn(4))
        return [made[-1]]

    module.get_inputs = get_inputs
    input_sets = harness.timing_input_sets(module, 7, torch.device("cpu"), 4)
    assert [s[0] for s in input_sets] == made and len(made) == 2
