"""One reward path: the component registry, the one weighted total, custom components by dotted
path, the one speedup cap, and the old cap key refused with the new key's name."""

from __future__ import annotations

import math
import pickle
from dataclasses import replace

import pytest
import torch

from kernelrl.env.result import EvalResult, Status
from kernelrl.launch.recipe import RecipeError
from kernelrl.launch.train_cli import parse_train_recipe
from kernelrl.rewards import (
    REGISTRY,
    REWARD_FUNCS,
    Component,
    RewardConfig,
    build_reward_funcs,
    components_of,
    reward_components,
    reward_weights,
    total_reward,
    weighted_total,
)
from kernelrl.rewards.outcomes import OUTCOMES, correct_gpu, preset_config
from kernelrl.rl import steps

SMOKE = ["--config", "recipes/smoke/cpu.yaml"]


def one_line_short(result: EvalResult, config: RewardConfig) -> float:
    """A custom component: 1 for a result whose feedback is one line."""
    return 1.0 if "\n" not in result.feedback else 0.0


#: A custom component with its own name and weight.
FAST = Component("fast_reward", lambda r, c: float((r.speedup_vs_eager or 0) > 2), weight=0.25)


def test_every_table_is_derived_from_the_registry() -> None:
    names = list(REGISTRY)
    assert names == [
        "format_reward",
        "correctness_reward",
        "speedup_reward",
        "profiling_reward",
        "integrity_penalty",
    ]
    config = RewardConfig(profiling_weight=0.3)
    funcs, weights = build_reward_funcs(config)
    assert [f.__name__ for f in funcs] == names == list(REWARD_FUNCS)
    assert list(reward_weights(config)) == names and weights[3] == 0.3
    assert list(reward_components(correct_gpu(2.0), config)) == names
    for name, entry in REGISTRY.items():  # each built-in weight is a RewardConfig key
        assert entry.name == name and isinstance(entry.weight, str)
        assert entry.weight in RewardConfig.__dataclass_fields__


def test_weighted_total_is_the_trained_reward_and_the_scalar_one() -> None:
    """Training's batch reward (rl/steps.py) and total_reward (evaluation, scripts, the README
    table) are the same function: a turn's reward is the same float both ways."""
    for preset in ("kernelrl", "drkernel"):
        config = preset_config(preset)
        results = [make() for make in OUTCOMES.values()]
        rows = torch.tensor(
            [list(reward_components(r, config).values()) for r in results], dtype=torch.float64
        )
        weights = torch.tensor(list(reward_weights(config).values()), dtype=torch.float64)
        batch = steps.RewardedTurns(
            rows[:, None, :], weights, torch.ones(len(results), 1, dtype=torch.bool),
            torch.ones(len(results), 1),
        )  # fmt: skip
        for i, r in enumerate(results):
            expected = total_reward(r, config)
            got = batch.rewards[i, 0].item()
            assert got == (0.0 if math.isnan(expected) else expected)  # exact, not approx


def test_weighted_total_nan_semantics() -> None:
    nan = math.nan
    values = torch.tensor([[1.0, nan, 2.0], [nan, nan, nan], [0.5, 0.5, 0.5]])
    total = weighted_total(values, [1.0, 5.0, 0.5])
    assert total[0].item() == 2.0  # a component without a value adds nothing (TRL's nansum)
    assert math.isnan(total[1].item())  # unscored: NaN, never 0
    assert total[2].item() == pytest.approx(3.25)


def test_custom_components_by_dotted_path() -> None:
    config = RewardConfig(
        reward_funcs=[
            "correctness_reward",
            "tests.rewards.test_reward_registry.one_line_short",
            "tests.rewards.test_reward_registry.FAST",
        ]
    )
    assert [c.name for c in components_of(config)] == [
        "correctness_reward",
        "one_line_short",
        "fast_reward",
    ]
    assert reward_weights(config) == {
        "correctness_reward": 1.0,
        "one_line_short": 1.0,
        "fast_reward": 0.25,
    }
    r = replace(correct_gpu(4.0), feedback="ok")
    assert reward_components(r, config) == {
        "correctness_reward": 1.0,
        "one_line_short": 1.0,
        "fast_reward": 1.0,
    }
    assert total_reward(r, config) == 2.25
    funcs, weights = build_reward_funcs(config)
    assert [f.__name__ for f in funcs] == ["correctness_reward", "one_line_short", "fast_reward"]
    clone = pickle.loads(pickle.dumps(funcs[1]))  # TRL may ship reward functions elsewhere
    assert clone(["p"], ["c"], eval_results=[r]) == [1.0]
    harness = EvalResult("t", "triton", Status.HARNESS_ERROR)
    assert funcs[1](["p"], ["c"], eval_results=[harness]) == [None]


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (["no_such_reward"], "unknown reward component 'no_such_reward'"),
        (["tests.rewards.test_reward_registry.nothing_here"], "cannot load reward component"),
        (["kernelrl.no_such_module.f"], "cannot load reward component"),
        (["tests.rewards.test_reward_registry.SMOKE"], "not a scorer"),
        (["format_reward", "format_reward"], "names a component twice"),
    ],
)
def test_bad_reward_funcs_fail_when_the_recipe_is_parsed(specs: list[str], message: str) -> None:
    with pytest.raises(RecipeError, match=message):
        parse_train_recipe([*SMOKE, "--reward_funcs", *specs])
    with pytest.raises(ValueError, match=message):
        components_of(RewardConfig(reward_funcs=specs))


def test_custom_component_from_a_recipe() -> None:
    args, _ = parse_train_recipe(
        [*SMOKE, "--reward_funcs", "correctness_reward", "tests.rewards.test_reward_registry.FAST"]
    )
    funcs, weights = build_reward_funcs(args.reward)
    assert [f.__name__ for f in funcs] == ["correctness_reward", "fast_reward"]
    assert weights == [1.0, 0.25]


def test_one_speedup_cap_for_every_preset() -> None:
    fast = correct_gpu(8.0, 1.0)
    for preset, capped in (("kernelrl", 2.0), ("drkernel", 2.0)):
        args, _ = parse_train_recipe(
            [*SMOKE, "--reward_preset", preset, "--speedup_clip_max", "2.0"]
        )
        assert args.reward.speedup_clip_max == 2.0
        assert reward_components(fast, args.reward)["speedup_reward"] == capped
    # defaults: log2 capped at 3 (8x) for kernelrl, the speedup capped at 3 for drkernel
    assert reward_components(fast, preset_config("kernelrl"))["speedup_reward"] == 3.0
    assert reward_components(correct_gpu(5.0), preset_config("drkernel"))["speedup_reward"] == 3.0


def test_the_old_cap_key_names_the_new_one() -> None:
    with pytest.raises(RecipeError) as caught:
        parse_train_recipe([*SMOKE, "--drkernel_speedup_cap", "2.0"])
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("drkernel_speedup_cap was replaced by speedup_clip_max")


def test_a_preset_is_applied_once_and_survives_replace() -> None:
    drkernel = preset_config("drkernel")
    assert (drkernel.format_weight, drkernel.speedup_transform) == (0.0, "linear")
    again = replace(drkernel, speedup_baseline="compile")  # __post_init__ runs again
    assert again.correctness_weight == 0.5 and again.speedup_baseline == "compile"
    with pytest.raises(ValueError, match="reward_preset=drkernel defines format_weight"):
        RewardConfig(reward_preset="drkernel", format_weight=0.3)
