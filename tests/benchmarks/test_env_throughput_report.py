"""What the throughput benchmark prints of the compile companions: counts, and the reasons the
children gave for a kernel they compiled themselves, most frequent first."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import env_throughput  # noqa: E402


def test_the_companions_line_counts_kernels_and_names_the_reasons_for_misses() -> None:
    differs = "the companion's key differs: option debug (False here, True there)"
    records = [
        {"companion": "handed to the child", "compiled_ahead": 1, "found": 1, "errors": []},
        {
            "companion": "handed to the child",
            "compiled_ahead": 1,
            "compiled_here": 1,
            "errors": [differs],
        },
        {
            "companion": "handed to the child",
            "compiled_ahead": 1,
            "compiled_here": 1,
            "errors": [differs],
        },
        {"companion": "not ready within 5 s", "errors": []},
    ]
    line = env_throughput.companions(
        [SimpleNamespace(sandbox={"compile_ahead": r}) for r in records]
    )
    assert line.splitlines() == [
        "compile companions: 3 of 4 handed to their child; kernels found compiled by one 1, "
        "compiled in the child 2",
        f"  2 x {differs}",
    ]
