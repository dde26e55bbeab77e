"""The published-size harness's summary of where a set's time went, and why a correct
evaluation's timing went unused."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from kernelbench_harness import phase_sums  # noqa: E402
from kernelbench_kernelrl import result_row, timing_shared  # noqa: E402

from kernelrl.env.gpu_claim import SHARED_WITH_KEY, SHARING_UNKNOWN_KEY  # noqa: E402


def test_phase_sums_add_every_evaluation_largest_first() -> None:
    runs = {
        "19_ReLU": [{"phase_seconds": {"compare": 4.5, "admission": 1.0}}],
        "23_Softmax": [
            {"phase_seconds": {"compare": 0.5, "reference_prepare": 2.25}},
            {"status": "harness_error"},  # no phases recorded
        ],
    }
    assert list(phase_sums(runs).items()) == [
        ("compare", 5.0),
        ("reference_prepare", 2.2),
        ("admission", 1.0),
    ]


def test_an_unused_timing_says_who_shared_the_gpu_or_why_nobody_could_tell() -> None:
    assert timing_shared({}) == ""
    assert timing_shared({SHARED_WITH_KEY: [4242]}) == "shared with evaluators [4242]"
    why = "the GPU was not found quiet within 2 s of pausing the sandboxes"
    evaluation = {"status": "correct", "sandbox": {SHARING_UNKNOWN_KEY: why}}
    row = result_row(evaluation, timing_shared(evaluation["sandbox"]))
    assert row["status"] == "correct" and row["timing_shared"] == why
