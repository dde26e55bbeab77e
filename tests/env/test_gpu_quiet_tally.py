"""A quiet-GPU wait that times out says what its probes found, so that a user reading an
unused timing can tell another context's kernels (launches late) from its copies (reads slow)
from this host (probes held off the CPU). The probe itself is tested on a GPU
(tests/env/test_gpu_quiet.py)."""

from __future__ import annotations

from kernelrl.env.gpu_quiet import ProbeTally


def test_the_tally_says_what_each_probe_found_with_medians() -> None:
    tally = ProbeTally(
        probes=7,
        held_off_cpu=2,
        queued_late=1,
        late_launches=2,
        slow_reads=1,
        launch_s=[9e-6, 400e-6, 500e-6],
        read_s=[30e-6, 31e-6, 60e-6],
    )
    assert tally.describe(limit_s=39e-6, read_limit_s=36e-6) == (
        "7 probes, 2 held off the CPU on this host, 2 launches over 39 us (median 400 us), "
        "1 reads queued too late to time, 1 reads over 36 us (median 31 us)"
    )


def test_a_wait_whose_probes_were_all_held_off_the_cpu_has_no_medians() -> None:
    tally = ProbeTally(probes=7, held_off_cpu=7)
    assert tally.describe(limit_s=39e-6, read_limit_s=36e-6) == (
        "7 probes, 7 held off the CPU on this host, 0 launches over 39 us, "
        "0 reads queued too late to time, 0 reads over 36 us"
    )


def test_a_wait_with_no_probe_back_says_so() -> None:
    assert ProbeTally().describe(limit_s=39e-6, read_limit_s=36e-6) == "no probe came back"
