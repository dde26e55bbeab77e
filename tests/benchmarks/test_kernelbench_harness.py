"""The published-size harness's summary of where a set's time went."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from kernelbench_harness import phase_sums  # noqa: E402


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
