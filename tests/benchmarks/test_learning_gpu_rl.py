"""benchmarks/learning_gpu_rl.sh: the RL stage's command line. Python is stood in for (the
script asks it for the GPU count, launches training and records the run), to check what
training is given: the run's own results store, and the caller's arguments after it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "learning_gpu_rl.sh"
PYTHON_STAND_IN = """#!/bin/sh
case $1 in
  -c) echo 0 ;;                          # torch.cuda.device_count()
  -m) echo "$@" >> "$CALLS" ;;           # the launch
  *) cat > /dev/null ;;                  # the run's record, a script on stdin
esac
"""


def test_training_gets_the_runs_results_store_and_the_callers_arguments_last(
    tmp_path: Path,
) -> None:
    if shutil.which("bash") is None:
        pytest.skip("needs bash")
    bin_dir, calls, run = tmp_path / "bin", tmp_path / "calls.txt", tmp_path / "run"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(PYTHON_STAND_IN)
    (bin_dir / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(calls)}
    env.pop("OUT", None)
    status = subprocess.run(
        ["bash", str(SCRIPT), "/sft", "/train.parquet", str(run), "--env_store_path", "/mine"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert status.returncode == 0, status.stderr
    argv = calls.read_text().split()
    assert argv[argv.index("--output_dir") + 1] == str(run)
    stores = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--env_store_path"]
    assert stores == [str(run / "env_results.sqlite"), "/mine"]  # the last one wins
