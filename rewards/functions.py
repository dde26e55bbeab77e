"""TRL reward functions over EvalResults, derived from the component registry.

Every component becomes a function with TRL's reward signature,
``f(prompts, completions, **kwargs) -> list[float | None]``, that reads
``kwargs["eval_results"]``: one EvalResult (or its ``to_dict`` form) per completion, in the
same order. The trainer evaluates the completions through the environment pool and passes the
results in; the reward functions never run a kernel. Each function's ``__name__`` is its
component name, so TRL logs ``rewards/<name>/mean`` for each separately.

``build_reward_funcs(config)`` returns the functions of the components ``config`` selects,
bound to it, and their weights, ready for ``GRPOTrainer(reward_funcs=...,
args=GRPOConfig(reward_weights=...))``.

An ``eval_results`` entry may be None where the evaluation itself could not be carried out, or
an EvalResult with status ``harness_error`` (kernelrl's harness failed, even after the pool's
retry): neither is the model's fault, so every function returns None for it. TRL (1.16) turns
None into NaN; a completion for which every function returned None is "unscorable": left out of
its group's mean and std and given advantage 0, instead of being scored 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kernelrl.rewards.components import (
    REGISTRY,
    Component,
    as_eval_result,
    components_of,
    rewarded,
)
from kernelrl.rewards.config import RewardConfig

RewardFunc = Callable[..., list[float | None]]


class RewardFunction:
    """A component as a TRL reward function, named after it (TRL logs it under ``__name__``),
    with a ``RewardConfig`` bound or read from ``kwargs["reward_config"]``. A plain object of
    this module, so it pickles to other processes with its component and config."""

    def __init__(self, component: Component, config: RewardConfig | None = None) -> None:
        self.component, self.config = component, config
        self.__name__ = component.name
        self.__doc__ = component.score.__doc__

    def __call__(
        self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any
    ) -> list[float | None]:
        name = self.component.name
        if "eval_results" not in kwargs:
            raise KeyError(
                f"{name} needs eval_results=[EvalResult, ...] aligned with the completions; the "
                "trainer must evaluate the completions through the environment pool and pass the "
                "results in"
            )
        results = kwargs["eval_results"]
        if len(results) != len(completions):
            raise ValueError(
                f"{name}: {len(results)} eval_results for {len(completions)} completions; they "
                "must be aligned"
            )
        config = self.config or kwargs.get("reward_config") or RewardConfig()
        results = [None if r is None else as_eval_result(r) for r in results]
        score = self.component.score
        return [float(score(r, config)) if rewarded(r) else None for r in results]

    def __repr__(self) -> str:
        return f"RewardFunction({self.__name__})"


#: The built-in components as TRL reward functions (reward config read from the kwargs).
REWARD_FUNCS: dict[str, RewardFunc] = {name: RewardFunction(c) for name, c in REGISTRY.items()}


def build_reward_funcs(config: RewardConfig | None = None) -> tuple[list[RewardFunc], list[float]]:
    """The components ``config`` selects, bound to it, and their weights (TRL's
    ``reward_weights``). Components of weight 0 are returned too, so each is still logged."""
    config = config or RewardConfig()
    selected = components_of(config)
    return [RewardFunction(c, config) for c in selected], [c.weight_in(config) for c in selected]
