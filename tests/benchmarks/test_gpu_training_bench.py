"""The pieces of benchmarks/gpu_training.py that decide what its GPU run reports
(gpu_training_prepare.py, gpu_training_report.py): the SFT data must teach the exact prompts RL
samples from, weight changes must not be faked by DeepSpeed's bf16 save, and the step breakdown
must add up."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import torch
from safetensors.torch import save_file

from kernelrl.env.parse import extract_solution
from kernelrl.launch.train_cli import build_task_dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import gpu_training_prepare as prepare  # noqa: E402
import gpu_training_report as report  # noqa: E402


def test_sft_rows_use_the_rl_prompts_and_parse(tmp_path: Path) -> None:
    assert prepare.make_sft_data(tmp_path, prepare.TASKS) == 2
    rows = pd.read_parquet(tmp_path / "train.parquet")
    args = SimpleNamespace(
        tasks=["bundled"],
        task_backend="triton",
        task_filter=prepare.TASKS,
        task_categories="",
        task_difficulty="",
        max_tasks=None,
        system_prompt="default",
        prompt_template=None,
    )
    rl = build_task_dataset(args)
    assert [list(p) for p in rows["prompt"]] == [list(p) for p in rl["prompt"]]
    for completion in rows["completion"]:
        assert "class ModelNew" in extract_solution(completion[0]["content"])


def test_weight_change_ignores_a_bf16_save_and_sees_an_update(tmp_path: Path) -> None:
    before, cast, moved = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for folder in (before, cast, moved):
        folder.mkdir()
    weights = {"w": torch.randn(8, 8), "v": torch.randn(4)}
    save_file(weights, str(before / "model.safetensors"))
    save_file({k: t.bfloat16() for k, t in weights.items()}, str(cast / "model.safetensors"))
    updated = {k: t.bfloat16() for k, t in weights.items()}
    updated["w"] = updated["w"] + 0.5
    save_file(updated, str(moved / "model.safetensors"))
    assert report.weight_change(before, cast)["tensors_changed"] == 0
    change = report.weight_change(before, moved)
    assert change["tensors_changed"] == 1 and change["max_abs_change"] > 0.4
    assert change["checksum_before"]["sum"] != change["checksum_after"]["sum"]


def test_breakdown_splits_the_step() -> None:
    history = [
        {
            "step_time": 3.0,
            "timing/rollout_and_score_s": 2.0,
            "timing/generation_s": 1.5,
            "timing/turn_eval_wait_s": 0.25,
            "timing/reward_wait_s": 0.25,
        }
    ]
    assert report._breakdown(history) == {
        "step_s": 3.0,
        "generation_s": 1.5,
        "evaluation_wait_s": 0.5,
        "rollout_and_score_s": 2.0,
        "update_s": 1.0,
    }
