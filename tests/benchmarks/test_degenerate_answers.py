"""benchmarks/degenerate_answers.py on CPU: its verdicts are those of the real check."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "degenerate_answers.py"

# Every output below fp32's atol 1e-4: the elementwise check alone passes zeros and 1/N.
WIDE_SOFTMAX = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.rand(8, 32768)]


def get_init_inputs():
    return []


KERNELRL = {"sizes": {"cpu": {}}}
"""

# 0 in exact arithmetic, rounding noise in fp32: zeros are the answer, and must pass.
ZERO_MEAN = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return ((x - x.mean(1, keepdim=True)) / x.std(1, keepdim=True)).mean(1)


def get_inputs():
    return [torch.randn(64, 4096)]


def get_init_inputs():
    return []


KERNELRL = {"sizes": {"cpu": {}}}
"""

# Loads, then fails to run: recorded, and the run goes on.
BROKEN = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x @ torch.ones(3, 3)


def get_inputs():
    return [torch.rand(4, 5)]


def get_init_inputs():
    return []
"""


def _script():
    spec = importlib.util.spec_from_file_location("degenerate_answers", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    folder = tmp_path_factory.mktemp("degenerate")
    (folder / "wide_softmax.py").write_text(WIDE_SOFTMAX)
    (folder / "zero_mean.py").write_text(ZERO_MEAN)
    (folder / "broken.py").write_text(BROKEN)
    tasks = [ROOT / "data" / "tasks" / name for name in ("01_relu.py", "09_sum_of_squares.py")]
    tasks += [folder / name for name in ("wide_softmax.py", "zero_mean.py", "broken.py")]
    args = [str(path) for path in tasks]
    out = folder / "out"
    assert (
        _script().main([*args, "--device", "cpu", "--task-seconds", "120", "--out", str(out)]) == 0
    )
    payload = json.loads((out / "degenerate_answers.json").read_text())
    payload["markdown"] = (out / "degenerate_answers.md").read_text()
    return payload


def test_zeros_pass_the_old_check_and_fail_the_new_one_on_a_wide_softmax(report: dict) -> None:
    wide = next(t for t in report["tasks"] if t["task"] == "wide_softmax")
    assert wide["status"] == "ok" and wide["capped"] == []
    for kind in ("zeros", "constant"):
        assert wide[kind]["old"] is True and wide[kind]["new"] is False, wide[kind]
        assert "carries no information" in wide[kind]["problem"]
    assert wide["row_mean"]["new"] is False
    assert wide["exact"]["old"] is True and wide["exact"]["new"] is True
    assert 0 <= wide["exact_vs_bound"] < 0.01
    assert 0.1 < wide["information"] < 0.5  # a softmax of values in [0, 1): ~0.28


def test_real_outputs_are_judged_as_the_check_does(report: dict) -> None:
    relu = next(t for t in report["tasks"] if t["task"] == "01_relu")
    assert relu["outputs"] == ["float32[16, 256]"]
    assert relu["zeros"]["old"] is False and relu["zeros"]["new"] is False
    assert relu["exact"]["new"] is True
    scalar = next(t for t in report["tasks"] if t["task"] == "09_sum_of_squares")
    assert scalar["constant"] is None and scalar["row_mean"] is None  # one value: no such answer
    broken = next(t for t in report["tasks"] if t["task"] == "broken")
    assert broken["status"] == "task error" and "fails to run" in broken["error"]


def test_a_reference_that_is_noise_is_listed_and_left_to_the_tolerance(report: dict) -> None:
    zero_mean = next(t for t in report["tasks"] if t["task"] == "zero_mean")
    zeros = zero_mean["zeros"]
    assert zeros["old"] and zeros["new"] and zeros["excused"], zeros
    assert zeros["rms"] > zeros["bound"] and zeros["noise"] > 0
    assert zero_mean["exact"]["new"] is True
    assert report["summary"]["noise"] == ["zero_mean"]


def test_the_summary_counts_the_table(report: dict) -> None:
    summary = report["summary"]
    assert summary["tasks"] == 5 and summary["compared"] == 4
    assert summary["zeros"] == {"judged": 4, "old": 2, "new": 1}
    assert [s.split(":")[0] for s in summary["not_compared"]] == ["broken"]
    assert "zeros fooled 2 -> 1 of 4" in report["markdown"]
    assert "| wide_softmax | float32[8, 32768] |" in report["markdown"]
