"""Reward components of one EvalResult: pure functions, no kernel is ever run here.

Each scorer maps ``(EvalResult, RewardConfig) -> float``; ``reward_components`` returns all of
them unweighted (for logging and multi-turn per-turn rewards) and ``total_reward`` their
weighted sum. The TRL-signature wrappers live in ``kernelrl.rewards.functions``.

Components (unweighted values):

- ``format_reward``: 1 when the completion held a parseable ``ModelNew`` (any status but
  ``format_error``), else 0.
- ``correctness_reward``: 1 for status ``correct``, else 0. ``not_run`` (CUDA C++ on a machine
  without a GPU) is not correct and scores 0.
- ``speedup_reward``: ``clip(log2(speedup), speedup_clip_min, speedup_clip_max)`` against the
  configured baseline (``speedup_vs_eager`` or ``speedup_vs_compile``), only for correct results
  with meaningful timings (GPU). Log scale makes 2x faster and 2x slower symmetric and keeps a
  rare 50x outlier from swamping the group; the clip bounds both tails. Anything else -
  incorrect, CPU timings, a missing baseline (e.g. torch.compile not timed) - scores 0: no
  measurement, no speedup signal. With ``speedup_transform="linear"`` (Dr. Kernel's) it is
  ``min(speedup, speedup_clip_max)``, and 0 for a speedup under ``speedup_clip_min``.
- ``profiling_reward``: the share of GPU time spent in the solution's own kernels
  (``own_kernel_share``, in [0, 1]) for correct results; it punishes "lazy optimisation" that
  wraps one trivial kernel around work left to torch. CPU fallback: on CPU no profile exists
  and ``own_kernel_share`` is None. A correct CPU result has nonetheless passed the checks
  that would have caught the work being left to torch - static ``no_custom_kernel`` and
  ``torch_fallback`` on the source, dynamic ``no_kernel_executed`` (every forward call launched
  an own kernel) and ``torch_fallback_runtime`` (forward dispatched no aten compute op) - so it
  gets ``profiling_cpu_fallback`` (default 1.0) when it recorded at least one
  own kernel launch (``custom_kernel_launches > 0``) and no check failed; otherwise 0. This is a
  proxy from integrity evidence, not a measured share: on CPU it adds no signal beyond
  correctness for Triton solutions, and time spent in the allowed torch ops (copies,
  ``contiguous``, allocation) is invisible there, so a solution that wastes most of its time in
  them still gets the fallback; only a GPU profile measures that. Set ``profiling_cpu_fallback=0`` to give no profiling
  reward without a profile.
- ``integrity_penalty``: ``-integrity_penalty_per_check * n`` for status
  ``integrity_violation``, where n is the number of failed checks (at least 1), else 0.

Unscored results: a ``harness_error`` (``EvalResult.scored`` is False) is a failure of
kernelrl's harness, not of the solution, so it has no reward at all: every component is NaN in
``reward_components`` and ``total_reward`` is NaN, and the TRL functions return None. Scoring
it 0 would punish the policy for our bug; NaN makes the omission loud if anything sums it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from kernelrl.env.result import EvalResult, Status
from kernelrl.rewards.config import COMPONENT_NAMES, RewardConfig


def as_eval_result(value: EvalResult | dict[str, Any]) -> EvalResult:
    """Accept an EvalResult or its ``to_dict`` form (results that crossed a process boundary)."""
    if isinstance(value, EvalResult):
        return value
    if isinstance(value, dict):
        return EvalResult.from_dict(value)
    raise TypeError(f"expected an EvalResult or its dict form, got {type(value).__name__}")


def is_scored(result: EvalResult | dict[str, Any] | None) -> bool:
    """Whether a result carries a verdict on the solution: False for None (no evaluation came
    back) and for ``harness_error`` (our harness failed, see ``EvalResult.scored``)."""
    if result is None:
        return False
    return Status(as_eval_result(result).status) is not Status.HARNESS_ERROR


def _status(result: EvalResult) -> Status:
    # Status(...) also accepts a plain string, so hand-built results compare correctly.
    return Status(result.status)


def format_score(result: EvalResult, config: RewardConfig) -> float:
    return 0.0 if _status(result) is Status.FORMAT_ERROR else 1.0


def correctness_score(result: EvalResult, config: RewardConfig) -> float:
    return 1.0 if _status(result) is Status.CORRECT else 0.0


def speedup_score(result: EvalResult, config: RewardConfig) -> float:
    if _status(result) is not Status.CORRECT or not result.timing_meaningful:
        return 0.0
    speedup = (
        result.speedup_vs_eager if config.speedup_baseline == "eager" else result.speedup_vs_compile
    )
    if speedup is None or math.isnan(speedup) or speedup <= 0:
        return 0.0
    if config.speedup_transform == "linear":  # Dr. Kernel: capped speedup, 0 under the bound
        return 0.0 if speedup < config.speedup_clip_min else min(speedup, config.speedup_clip_max)
    return min(max(math.log2(speedup), config.speedup_clip_min), config.speedup_clip_max)


def profiling_score(result: EvalResult, config: RewardConfig) -> float:
    if _status(result) is not Status.CORRECT:
        return 0.0
    share = result.own_kernel_share
    if share is not None:
        if math.isnan(share):
            return 0.0
        return min(max(float(share), 0.0), 1.0)
    # CPU: no profile; see the module docstring for why this fallback is justified.
    launched = (result.custom_kernel_launches or 0) > 0
    return config.profiling_cpu_fallback if launched and not result.checks_failed else 0.0


def integrity_score(result: EvalResult, config: RewardConfig) -> float:
    if _status(result) is not Status.INTEGRITY_VIOLATION:
        return 0.0
    return -config.integrity_penalty_per_check * max(1, len(result.checks_failed))


#: Component name -> scorer of one result.
SCORERS: dict[str, Callable[[EvalResult, RewardConfig], float]] = {
    "format_reward": format_score,
    "correctness_reward": correctness_score,
    "speedup_reward": speedup_score,
    "profiling_reward": profiling_score,
    "integrity_penalty": integrity_score,
}
assert tuple(SCORERS) == COMPONENT_NAMES


def reward_components(
    result: EvalResult | dict[str, Any], config: RewardConfig | None = None
) -> dict[str, float]:
    """All components of one result, unweighted, in ``COMPONENT_NAMES`` order; all NaN for an
    unscored result (``harness_error``)."""
    config = config or RewardConfig()
    result = as_eval_result(result)
    if not is_scored(result):
        return {name: math.nan for name in SCORERS}
    return {name: scorer(result, config) for name, scorer in SCORERS.items()}


def total_reward(result: EvalResult | dict[str, Any], config: RewardConfig | None = None) -> float:
    """Weighted sum of the components: the scalar reward of one result (one turn); NaN for an
    unscored result (``harness_error``), never 0."""
    config = config or RewardConfig()
    weights = config.weights()
    return sum(weights[name] * value for name, value in reward_components(result, config).items())
