"""kernelrl.rewards: EvalResult -> scalar rewards, as composable TRL reward functions.

Rewards read EvalResults; they never run kernels. Public API:

- ``RewardConfig``: which components (``reward_funcs``), their weights, speedup baseline
  ("eager" | "compile"), transform ("log2" | "linear") and cap (``speedup_clip_max``),
  integrity penalty, CPU fallback of the profiling reward, and ``reward_preset``
  (``REWARD_PRESETS``: ``kernelrl`` | ``drkernel``, Dr. Kernel's shipped reward
  ``0.5*correct + 0.5*min(speedup, 3) + 0.5*own_kernel_share`` when correct, 0 otherwise;
  ``drkernel_reward_config()`` builds it).
- The component registry: ``Component``, ``@component(name, weight=...)``, ``REGISTRY``;
  ``components_of(config)`` and ``reward_weights(config)`` for the components a run scores.
- ``weighted_total(components, weights)``: the one definition of the scalar reward, used by
  training on batches of turns; ``total_reward(result, config)`` applies it to one result, and
  ``reward_components(result, config)`` gives the unweighted components.
- TRL reward functions: ``build_reward_funcs(config) -> (funcs, weights)`` for
  ``GRPOTrainer(reward_funcs=...)`` and ``GRPOConfig(reward_weights=...)``; ``REWARD_FUNCS``
  (the built-ins, reading ``kwargs["reward_config"]``); ``RewardFunction(component, config)``.
- ``is_scored(result)`` (``kernelrl.env.result``'s): False for a missing result or a
  ``harness_error`` (kernelrl's failure, not the solution's): such a completion gets no reward
  (None from the TRL functions, NaN from ``reward_components``/``total_reward``), never 0.
  ``rewarded(result)``: scored, and not ``speed_unjudged`` (a correct GPU result without a
  judged speed: its timing left unused, or its speed-up missing), which gets no reward either.

See ``kernelrl.rewards.components`` for the exact definition of every component.
"""

from kernelrl.env.result import is_scored
from kernelrl.rewards.components import (
    REGISTRY,
    Component,
    as_eval_result,
    component,
    components_of,
    reward_components,
    reward_weights,
    rewarded,
    speed_unjudged,
    total_reward,
    weighted_total,
)
from kernelrl.rewards.config import (
    REWARD_PRESETS,
    SPEEDUP_BASELINES,
    SPEEDUP_TRANSFORMS,
    RewardConfig,
    drkernel_reward_config,
)
from kernelrl.rewards.functions import REWARD_FUNCS, RewardFunction, build_reward_funcs

__all__ = [
    "REGISTRY",
    "REWARD_FUNCS",
    "REWARD_PRESETS",
    "SPEEDUP_BASELINES",
    "SPEEDUP_TRANSFORMS",
    "Component",
    "RewardConfig",
    "as_eval_result",
    "build_reward_funcs",
    "component",
    "components_of",
    "drkernel_reward_config",
    "is_scored",
    "rewarded",
    "speed_unjudged",
    "reward_components",
    "RewardFunction",
    "reward_weights",
    "total_reward",
    "weighted_total",
]
