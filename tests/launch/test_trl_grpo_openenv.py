"""``examples/trl_grpo_openenv.py`` runs here: TRL's GRPOTrainer (not kernelrl's) trains a step of
SmolLM2-135M on CPU against kernelrl's environment served by OpenEnv, each sample a two-turn
episode judged in the sandbox, the second turn written after the environment's feedback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kernelrl.env.result import Status

EXAMPLE = Path(__file__).parents[2] / "examples" / "trl_grpo_openenv.py"

pytestmark = pytest.mark.slow


def test_the_example_trains_a_step_against_the_openenv_environment(tmp_path: Path) -> None:
    command = [sys.executable, str(EXAMPLE), "--tasks", "01_relu", "--max-steps", "1"]
    command += ["--num-generations", "2", "--max-turns", "2", "--max-new-tokens", "24"]
    command += ["--threads", "1", "--output-dir", str(tmp_path / "run")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 1
    episodes = summary["episodes"]
    assert len(episodes) == 2 and {e["task_id"] for e in episodes} == {"01_relu"}
    for episode in episodes:
        statuses = episode["statuses"]
        assert all(s in {str(v) for v in Status} for s in statuses), statuses
        assert isinstance(episode["reward"], float)
        if statuses[0] != "correct":  # 24 tokens do not make a kernel: a second turn follows
            assert len(statuses) == 2 and episode["feedback_tokens"] > 0
