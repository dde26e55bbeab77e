"""Dr. Kernel's definitions as recipe presets: selection, exclusivity with our keys, the 14B
recipe with their hyperparameters."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelrl.launch.train_cli import parse_train_recipe
from kernelrl.rewards import RewardConfig, drkernel_reward_config
from kernelrl.rl.config import train_config

ROOT = Path(__file__).resolve().parents[2]
DRKERNEL_14B = ROOT / "recipes" / "qwen3-14b" / "trloo" / "drkernel_14b.yaml"
CPU = {"output_dir": "/tmp/kernelrl-presets", "use_cpu": True, "bf16": False}


def test_ours_is_the_default() -> None:
    config = train_config(**CPU)
    assert (config.advantage, config.reward.reward_preset, config.rejection.rejection_preset) == (
        "trloo",
        "kernelrl",
        "kernelrl",
    )
    assert config.reward == RewardConfig()


def test_drkernel_presets_select_their_definitions() -> None:
    config = train_config(
        advantage="drkernel_trloo", reward_preset="drkernel", rejection_preset="drkernel",
        speedup_clip_max=2.0, drkernel_prs_threshold=0.4, drkernel_prs_ramp=0.0,
        speedup_baseline="compile", **CPU,
    )  # fmt: skip
    assert config.reward == drkernel_reward_config("compile", speedup_clip_max=2.0)
    assert (config.reward.speedup_transform, config.reward.speedup_clip_max) == ("linear", 2.0)
    prs = config.rejection.drkernel_config()
    assert (prs.threshold, prs.ramp) == (0.4, 0.0)


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"reward_preset": "drkernel", "format_weight": 0.2}, "reward_preset=drkernel defines"),
        ({"reward_preset": "drkernel", "speedup_clip_min": 1.0}, "speedup_clip_min"),
        ({"reward_preset": "drkernel", "reward_funcs": ["format_reward"]}, "reward_funcs"),
        ({"rejection_preset": "drkernel", "rejection_mode": "downweight"}, "rejection_mode"),
        ({"advantage": "drkernel_trloo", "turn_return": "discounted"}, "returns-to-go"),
        ({"reward_preset": "theirs"}, "reward_preset must be one of"),
        ({"rejection_preset": "x"}, "rejection_preset must be one of"),
        ({"advantage": "loo"}, "advantage must be one of"),
        ({"drkernel_prs_ramp": -1.0}, "ramp"),
    ],
)
def test_conflicting_or_bad_keys_are_refused(keys: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        train_config(**keys, **CPU)


def test_drkernel_14b_recipe_has_their_hyperparameters() -> None:
    args, model = parse_train_recipe(
        ["--config", str(DRKERNEL_14B), "--use_cpu", "true", "--bf16", "false"]
    )
    assert (args.advantage, args.reward.reward_preset, args.rejection.rejection_preset) == (
        "drkernel_trloo",
        "drkernel",
        "drkernel",
    )
    assert args.turn_gamma == 1.0 and args.max_turns == 3
    assert args.num_generations == 16
    # 16 prompts x 16 samples per optimizer step on their 16 trainer processes.
    per_step = args.per_device_train_batch_size * 16 * args.gradient_accumulation_steps
    assert per_step == 16 * 16 and args.steps_per_generation == args.gradient_accumulation_steps
    assert args.learning_rate == 1e-6 and (args.epsilon, args.epsilon_high) == (0.2, 0.28)
    assert args.beta == 0.0 and args.temperature == 1.0 and args.top_p == 1.0
    assert args.reward == drkernel_reward_config()
