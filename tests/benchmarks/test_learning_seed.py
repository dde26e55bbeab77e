"""benchmarks/learning_seed.sh: one run of the learning protocol in one GPU window. Its
programs (python3 for learning.py, the RL script) are stood in for, to check what runs in
which order with which seeds: SFT's held-out sweep before RL, RL from the SFT checkpoint
fixed before the run, its one checkpoint (step 15) swept, the KernelBench set answered last."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "learning_seed.sh"
PYTHON = """#!/bin/sh
case $1 in
  -c) echo /gpu/bench/sft_model/checkpoint-150 ;;   # the chosen SFT checkpoint, from stages.json
  *) echo "python3 $*" >> "$CALLS" ;;
esac
"""
RL = """#!/bin/sh
echo "rl $*" >> "$CALLS"
"""


def _run(tmp_path: Path, *args: str) -> tuple[int, list[str]]:
    if shutil.which("bash") is None:
        pytest.skip("needs bash")
    root, bin_dir = tmp_path / "root", tmp_path / "bin"
    (root / "benchmarks").mkdir(parents=True)
    bin_dir.mkdir()
    shutil.copy(SCRIPT, root / "benchmarks" / SCRIPT.name)
    (root / "benchmarks" / "learning_gpu_rl.sh").write_text(RL)
    (bin_dir / "python3").write_text(PYTHON)
    (bin_dir / "python3").chmod(0o755)
    calls = tmp_path / "calls.txt"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(calls)}
    status = subprocess.run(
        ["bash", str(root / "benchmarks" / SCRIPT.name), "/gpu/bench", *args],
        env=env,
        capture_output=True,
        text=True,
    ).returncode
    return status, calls.read_text().splitlines() if calls.exists() else []


def _value(call: str, flag: str) -> str:
    words = call.split()
    return words[words.index(flag) + 1]


def _only(call: str) -> list[str]:
    words = call.split()
    return words[words.index("--only") + 1 :]


def test_one_seed_runs_sft_its_sweep_rl_the_choice_and_the_sets_in_order(tmp_path: Path) -> None:
    status, calls = _run(tmp_path, "3")
    assert status == 0 and len(calls) == 3
    first, rl, last = calls
    assert _only(first) == ["sft", "select_sft", "eval_sft", "curriculum"]
    assert _value(first, "--sft-recipe") == "recipes/smollm2/learning/sft_gpu.yaml"
    assert _value(first, "--sft-candidates") == "final" and _value(first, "--run-seed") == "3"
    assert rl.split()[1:3] == [
        "/gpu/bench/sft_model/checkpoint-150",
        "/gpu/bench/curriculum/data.parquet",
    ]
    assert _value(rl, "--seed") == "103" and _value(rl, "--max_steps") == "15"
    assert _value(rl, "--save_steps") == "15"  # one candidate, step 15: no validation sweep
    assert _only(last) == ["rl", "select_rl", "eval_rl", "generate_kb"]
    assert _value(last, "--rl-from") == "/gpu/bench/rl_run_protocol"
    assert _value(last, "--sft-model") == "/gpu/bench/sft_model/checkpoint-150"
    for call in (first, last):  # every sweep on the GPU, sampled and judged there
        assert "env_device=cuda" in call and "overlap=false" in call
        assert (
            _value(call, "--samples") == "4" and _value(call, "--curriculum") == "beyond-references"
        )


def test_the_base_model_is_swept_once_on_its_own(tmp_path: Path) -> None:
    status, calls = _run(tmp_path, "1", "base")
    assert status == 0 and len(calls) == 1
    assert _only(calls[0]) == ["eval_base", "generate_kb"] and "--kb-base" in calls[0]


def test_an_unknown_phase_is_refused(tmp_path: Path) -> None:
    status, calls = _run(tmp_path, "1", "both")
    assert status == 2 and calls == []
