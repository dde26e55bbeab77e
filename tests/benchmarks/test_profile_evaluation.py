"""benchmarks/profile_evaluation.py: a name it does not know is a one-line error; with a
KernelBench checkout (KERNELBENCH_DIR), a real solution evaluated twice on the CPU, the second
profiled down to the comparison of each chunk."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import profile_evaluation  # noqa: E402

KERNELBENCH_DIR = os.environ.get("KERNELBENCH_DIR")


def test_an_unknown_solution_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        profile_evaluation.main(["--kernelbench", str(tmp_path), "no_such_task"])
    assert exit_.value.code == 2
    assert "no solution in" in capsys.readouterr().err


@pytest.mark.skipif(not KERNELBENCH_DIR, reason="KERNELBENCH_DIR is not set")
def test_a_solution_is_profiled_on_the_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        profile_evaluation.main(["--kernelbench", KERNELBENCH_DIR, "--device", "cpu", "19_ReLU"])
        == 0
    )
    out = capsys.readouterr().out
    assert "level1/19_ReLU: correct, then correct; phases {" in out
    assert "add_chunk" in out and "Ordered by: cumulative time" in out
