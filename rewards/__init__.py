"""kernelrl.rewards: EvalResult -> scalar rewards, as composable TRL reward functions.

Rewards read EvalResults; they never run kernels. Public API:

- ``RewardConfig``: component weights, speedup baseline ("eager" | "compile"), transform
  ("log2" | "linear") and clip, integrity penalty, CPU fallback of the profiling reward.
- ``drkernel_reward_config()``: Dr. Kernel's shipped reward (``0.5*correct + 0.5*min(speedup,
  3) + 0.5*own_kernel_share`` when correct, 0 otherwise) as a RewardConfig of our components
  (``REWARD_PRESETS``: ``kernelrl`` | ``drkernel``).
- TRL reward functions ``format_reward``, ``correctness_reward``, ``speedup_reward``,
  ``profiling_reward``, ``integrity_penalty``: ``f(prompts, completions, **kwargs)`` reading
  ``kwargs["eval_results"]`` (and an optional ``kwargs["reward_config"]``).
- ``build_reward_funcs(config) -> (funcs, weights)`` for ``GRPOTrainer(reward_funcs=...)`` and
  ``GRPOConfig(reward_weights=...)``.
- ``reward_components(result, config) -> dict`` (unweighted) and ``total_reward(result, config)``
  (weighted sum) for multi-turn per-turn rewards and logging.
- ``is_scored(result)``: False for a missing result or a ``harness_error`` (kernelrl's failure,
  not the solution's): such a completion gets no reward (None from the TRL functions, NaN from
  ``reward_components``/``total_reward``), never 0.

See ``kernelrl.rewards.components`` for the exact definition of every component.
"""

from kernelrl.rewards.components import (
    SCORERS,
    as_eval_result,
    is_scored,
    reward_components,
    total_reward,
)
from kernelrl.rewards.config import (
    COMPONENT_NAMES,
    REWARD_PRESETS,
    SPEEDUP_BASELINES,
    SPEEDUP_TRANSFORMS,
    RewardConfig,
    drkernel_reward_config,
)
from kernelrl.rewards.functions import (
    REWARD_FUNCS,
    bind_reward_func,
    build_reward_funcs,
    correctness_reward,
    format_reward,
    integrity_penalty,
    profiling_reward,
    speedup_reward,
)

__all__ = [
    "COMPONENT_NAMES",
    "REWARD_FUNCS",
    "REWARD_PRESETS",
    "SCORERS",
    "SPEEDUP_BASELINES",
    "SPEEDUP_TRANSFORMS",
    "RewardConfig",
    "as_eval_result",
    "bind_reward_func",
    "build_reward_funcs",
    "correctness_reward",
    "drkernel_reward_config",
    "format_reward",
    "integrity_penalty",
    "is_scored",
    "profiling_reward",
    "reward_components",
    "speedup_reward",
    "total_reward",
]
