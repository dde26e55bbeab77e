"""TRL reward functions over EvalResults.

Every component is a function with TRL's reward signature,
``f(prompts, completions, **kwargs) -> list[float | None]``, that reads
``kwargs["eval_results"]``: one EvalResult (or its ``to_dict`` form) per completion, in the
same order. The trainer evaluates the completions through the environment pool and passes the
results in; the reward functions never run a kernel. Each function's ``__name__`` is its
component name, so TRL logs ``rewards/<name>/mean`` for each separately.

``build_reward_funcs(config)`` returns the functions bound to a RewardConfig and their weights,
ready for ``GRPOTrainer(reward_funcs=..., args=GRPOConfig(reward_weights=...))``.

An ``eval_results`` entry may be None where the evaluation itself could not be carried out, or
an EvalResult with status ``harness_error`` (kernelrl's harness failed, even after the pool's
retry): neither is the model's fault, so every function returns None for it. TRL (1.16) turns
None into NaN; a completion for which every function returned None is "unscorable": left out of
its group's mean and std and given advantage 0, instead of being scored 0.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from kernelrl.rewards.components import SCORERS, as_eval_result, is_scored
from kernelrl.rewards.config import COMPONENT_NAMES, RewardConfig

RewardFunc = Callable[..., list[float | None]]


def _score(name: str, completions: Sequence[Any], kwargs: dict[str, Any]) -> list[float | None]:
    if "eval_results" not in kwargs:
        raise KeyError(
            f"{name} needs eval_results=[EvalResult, ...] aligned with the completions; the trainer "
            "must evaluate the completions through the environment pool and pass the results in"
        )
    results = kwargs["eval_results"]
    if len(results) != len(completions):
        raise ValueError(
            f"{name}: {len(results)} eval_results for {len(completions)} completions; they must be aligned"
        )
    config = kwargs.get("reward_config") or RewardConfig()
    scorer = SCORERS[name]
    scored = [as_eval_result(r) if is_scored(r) else None for r in results]
    return [None if r is None else scorer(r, config) for r in scored]


def format_reward(
    prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any
) -> list[float | None]:
    """1 when the completion held a parseable ModelNew, else 0."""
    return _score("format_reward", completions, kwargs)


def correctness_reward(
    prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any
) -> list[float | None]:
    """1 for a correct result, else 0."""
    return _score("correctness_reward", completions, kwargs)


def speedup_reward(
    prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any
) -> list[float | None]:
    """Clipped log2 speedup vs the configured baseline for correct, GPU-timed results; else 0."""
    return _score("speedup_reward", completions, kwargs)


def profiling_reward(
    prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any
) -> list[float | None]:
    """Own kernels' share of GPU time for correct results (CPU fallback: see components)."""
    return _score("profiling_reward", completions, kwargs)


def integrity_penalty(
    prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any
) -> list[float | None]:
    """-penalty per failed check for integrity violations, else 0."""
    return _score("integrity_penalty", completions, kwargs)


REWARD_FUNCS: dict[str, RewardFunc] = {
    "format_reward": format_reward,
    "correctness_reward": correctness_reward,
    "speedup_reward": speedup_reward,
    "profiling_reward": profiling_reward,
    "integrity_penalty": integrity_penalty,
}
assert tuple(REWARD_FUNCS) == COMPONENT_NAMES


def bind_reward_func(name: str, config: RewardConfig) -> RewardFunc:
    """The component ``name`` with ``config`` bound: a picklable partial carrying the
    component's ``__name__`` (TRL accepts partials and logs them under that name)."""
    func = REWARD_FUNCS[name]
    bound = functools.partial(func, reward_config=config)
    functools.update_wrapper(bound, func)
    return bound


def build_reward_funcs(config: RewardConfig | None = None) -> tuple[list[RewardFunc], list[float]]:
    """All components bound to ``config``, and their weights (TRL's ``reward_weights``).

    Every component is returned, also those with weight 0, so each is still logged.
    """
    config = config or RewardConfig()
    weights = config.weights()
    funcs = [bind_reward_func(name, config) for name in COMPONENT_NAMES]
    return funcs, [weights[name] for name in COMPONENT_NAMES]
