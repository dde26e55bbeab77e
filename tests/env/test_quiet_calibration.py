"""The quiet probe's calibration on a host slower than the one its cushion was chosen on: the
cushion of untimed reads grows until the host queues the timed read in time, and a host that
never does is named in the error. The probe's GPU work is replaced by a host whose queuing
time is set, so the rule runs on the CPU; tests/env/test_gpu_quiet.py runs the real probe."""

from __future__ import annotations

import pytest

from kernelrl.env import gpu_quiet
from kernelrl.env.gpu_quiet import CUSHION_READS, CUSHION_READS_MAX, ProbeTally, QuietProbe

READ_S = 40e-6  # a quiet read of the probe's block on an H200


def _probe_on_a_host_queuing_in(queue_s: float) -> QuietProbe:
    """A probe whose reads take READ_S on the GPU and whose host takes ``queue_s`` to queue the
    timed one: ``_judge`` decides, as on a GPU."""
    probe = QuietProbe.__new__(QuietProbe)
    probe.fastest_s, probe.quiet_read_s = float("inf"), float("inf")
    probe.cushion_reads, probe.tally = CUSHION_READS, ProbeTally()

    def one_probe(deadline: float) -> bool:
        return probe._judge(10e-6, 0.0, queue_s, READ_S)

    probe._probe = one_probe
    return probe


def test_a_fast_host_calibrates_with_the_first_cushion() -> None:
    probe = _probe_on_a_host_queuing_in(50e-6)
    probe._calibrate()
    assert probe.cushion_reads == CUSHION_READS
    assert probe.quiet_read_s == pytest.approx(READ_S)


def test_a_slow_host_calibrates_with_a_cushion_it_fills_in_time() -> None:
    """Queuing the timed read takes 5 reads' time (launches slowed by a profiler, say): two
    reads of cushion never cover it, eight do."""
    probe = _probe_on_a_host_queuing_in(5 * READ_S)
    probe._calibrate()
    assert probe.cushion_reads == 8
    assert probe.quiet_read_s == pytest.approx(READ_S)
    assert probe.read_limit_s() == pytest.approx(gpu_quiet.READ_FACTOR * READ_S)


def test_a_host_no_cushion_covers_is_named_in_the_error() -> None:
    probe = _probe_on_a_host_queuing_in(2 * CUSHION_READS_MAX * READ_S)
    with pytest.raises(RuntimeError, match=f"cushion of {CUSHION_READS_MAX} reads"):
        probe._calibrate()
