"""The reward components: one registry of (name, scorer, weight), and the one weighted total.

Every component is registered once, with ``@component(name, weight=...)`` on its scorer
``(EvalResult, RewardConfig) -> float``; the weight is the ``RewardConfig`` key that holds it
(a built-in) or a number (a custom component). Everything else - the TRL reward functions
(``kernelrl.rewards.functions``), the weights TRL receives, the component names training logs -
is derived from the registry, so adding a component is one decorated function.

``RewardConfig.reward_funcs`` selects the components of a run as TRL's ``reward_funcs`` does:
registered names or dotted import paths (``my_lib.rewards.memory_reward``) to a ``Component`` or
a scorer; default: every built-in in registration order.

``weighted_total`` is the one definition of the scalar reward, ``sum(weight_k * component_k)``:
training (``kernelrl.rl.steps``, ``kernelrl.rl.metrics``) applies it to a batch of turns,
``total_reward`` to one result (evaluation, benchmarks, scripts, the README's reward table).

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
  them still gets the fallback; only a GPU profile measures that. Set ``profiling_cpu_fallback=0``
  to give no profiling reward without a profile.
- ``integrity_penalty``: ``-integrity_penalty_per_check * n`` for status
  ``integrity_violation``, where n is the number of failed checks (at least 1), else 0.

Unscored results: a ``harness_error`` (``kernelrl.env.result.is_scored`` is False) is a failure
of kernelrl's harness, not of the solution, so it has no reward at all: every component is NaN
in ``reward_components`` and the total is NaN, and the TRL functions return None. Scoring it 0
would punish the policy for our bug; NaN makes the omission loud if anything sums it.

Unrewarded too, whatever the components: a correct GPU result without a judged speed
(``speed_unjudged``: its timing left unused, another evaluator's work on the GPU or the GPU not
found quiet before the timing, or its speed-up missing). Its speed is not known, and a
speed-up term of 0 would rank it above every slower kernel and below every faster one. The
solution can cause both itself: keep the GPU busy through that check (work it leaves queued, or
launches while it waits), or, timed beside an interleaved reference, report no input set timed,
so a 0 there would be a reward a slow solution could take instead of its own.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from kernelrl.env.result import EvalResult, Status, is_scored
from kernelrl.rewards.config import RewardConfig

#: ``score(result, config) -> float``: one component of one scored result.
Scorer = Callable[[EvalResult, RewardConfig], float]


@dataclass(frozen=True)
class Component:
    """A reward component: its name (what TRL logs as ``rewards/<name>``), its scorer, and its
    weight: the name of the ``RewardConfig`` key that holds it, or a fixed number."""

    name: str
    score: Scorer
    weight: str | float = 1.0

    def weight_in(self, config: RewardConfig) -> float:
        """This component's weight under ``config``."""
        return float(getattr(config, self.weight) if isinstance(self.weight, str) else self.weight)


#: The built-in components by name, in the order a run gets them by default.
REGISTRY: dict[str, Component] = {}


def component(name: str, weight: str | float) -> Callable[[Scorer], Scorer]:
    """Register the decorated scorer as the built-in component ``name``."""

    def register(score: Scorer) -> Scorer:
        if name in REGISTRY:
            raise ValueError(f"reward component {name!r} is registered twice")
        if isinstance(weight, str) and weight not in RewardConfig.__dataclass_fields__:
            raise ValueError(f"{name}: RewardConfig has no weight key {weight!r}")
        REGISTRY[name] = Component(name, score, weight)
        return score

    return register


def as_eval_result(value: EvalResult | dict[str, Any]) -> EvalResult:
    """Accept an EvalResult or its ``to_dict`` form (results that crossed a process boundary)."""
    if isinstance(value, EvalResult):
        return value
    if isinstance(value, dict):
        return EvalResult.from_dict(value)
    raise TypeError(f"expected an EvalResult or its dict form, got {type(value).__name__}")


# ---------------------------------------------------------------------- the built-ins
@component("format_reward", weight="format_weight")
def format_score(result: EvalResult, config: RewardConfig) -> float:
    """1 when the completion held a parseable ModelNew, else 0."""
    return 0.0 if result.status is Status.FORMAT_ERROR else 1.0


@component("correctness_reward", weight="correctness_weight")
def correctness_score(result: EvalResult, config: RewardConfig) -> float:
    """1 for a correct result, else 0."""
    return 1.0 if result.status is Status.CORRECT else 0.0


@component("speedup_reward", weight="speedup_weight")
def speedup_score(result: EvalResult, config: RewardConfig) -> float:
    """The capped speedup term of a correct, GPU-timed result; else 0."""
    if result.status is not Status.CORRECT or not result.timing_meaningful:
        return 0.0
    speedup = (
        result.speedup_vs_eager if config.speedup_baseline == "eager" else result.speedup_vs_compile
    )
    if speedup is None or math.isnan(speedup) or speedup <= 0:
        return 0.0
    if config.speedup_transform == "linear":  # Dr. Kernel: capped speedup, 0 under the bound
        return 0.0 if speedup < config.speedup_clip_min else min(speedup, config.speedup_clip_max)
    return min(max(math.log2(speedup), config.speedup_clip_min), config.speedup_clip_max)


@component("profiling_reward", weight="profiling_weight")
def profiling_score(result: EvalResult, config: RewardConfig) -> float:
    """Own kernels' share of GPU time of a correct result (CPU: the fallback)."""
    if result.status is not Status.CORRECT:
        return 0.0
    share = result.own_kernel_share
    if share is not None:
        if math.isnan(share):
            return 0.0
        return min(max(float(share), 0.0), 1.0)
    # CPU: no profile; see the module docstring for why this fallback is justified.
    launched = (result.custom_kernel_launches or 0) > 0
    return config.profiling_cpu_fallback if launched and not result.checks_failed else 0.0


@component("integrity_penalty", weight="integrity_weight")
def integrity_score(result: EvalResult, config: RewardConfig) -> float:
    """-penalty per failed check of an integrity violation, else 0."""
    if result.status is not Status.INTEGRITY_VIOLATION:
        return 0.0
    return -config.integrity_penalty_per_check * max(1, len(result.checks_failed))


# ---------------------------------------------------------------------- selection
def load_component(spec: str) -> Component:
    """A registered component by name, or one given by dotted import path: a ``Component``
    (its own name and weight) or a scorer (named after the function, weight 1)."""
    if spec in REGISTRY:
        return REGISTRY[spec]
    module_name, _, attribute = spec.rpartition(".")
    if not module_name:
        raise ValueError(
            f"unknown reward component {spec!r}: expected one of {list(REGISTRY)} or a dotted "
            "import path such as my_lib.rewards.my_component"
        )
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load reward component {spec!r}: {exc}") from exc
    if isinstance(found, Component):
        return found
    if callable(found):
        return Component(getattr(found, "__name__", attribute), found)
    raise ValueError(f"reward component {spec!r} is a {type(found).__name__}, not a scorer")


def components_of(config: RewardConfig) -> tuple[Component, ...]:
    """The components ``config`` selects (``reward_funcs``; default every built-in)."""
    if config.reward_funcs is None:
        return tuple(REGISTRY.values())
    selected = tuple(load_component(spec) for spec in config.reward_funcs)
    names = [c.name for c in selected]
    if len(set(names)) != len(names):
        raise ValueError(f"reward_funcs names a component twice: {names}")
    return selected


def reward_weights(config: RewardConfig) -> dict[str, float]:
    """Component name -> weight under ``config``, in component order."""
    return {c.name: c.weight_in(config) for c in components_of(config)}


# ---------------------------------------------------------------------- the total
def weighted_total(components: Tensor, weights: Tensor | Sequence[float]) -> Tensor:
    """``sum_k weights[k] * components[..., k]``: the scalar reward of a turn, the one definition.

    A NaN component (a reward function that gave no value for this turn) adds nothing, as in
    TRL; where every component is NaN (an unscored turn: ``harness_error`` or no result) the
    total is NaN, never 0. The terms are added in component order, so one turn's total is the
    same float in a batch and alone.
    """
    weights = torch.as_tensor(weights, dtype=components.dtype, device=components.device)
    terms = components * weights
    total = torch.zeros(components.shape[:-1], dtype=components.dtype, device=components.device)
    for k in range(terms.shape[-1]):
        term = terms[..., k]
        total = total + torch.where(term.isnan(), 0.0, term)
    return torch.where(components.isnan().all(dim=-1), math.nan, total)


def speed_unjudged(result: EvalResult) -> bool:
    """A correct result evaluated on a GPU without a judged speed: its timing left unused (the
    GPU shared with another evaluator's work, or whether it was could not be known) or its
    speed-up over eager PyTorch missing (a reference timing that did not happen: interleaved,
    a solution that reported no input set timed gives it none). The eager reference is timed
    on every GPU evaluation; the torch.compile one may be switched off, so its absence alone
    says nothing."""
    if result.status is not Status.CORRECT or torch.device(result.device).type != "cuda":
        return False
    speedup = result.speedup_vs_eager
    return not result.timing_meaningful or speedup is None or math.isnan(speedup)


def rewarded(result: EvalResult | None) -> bool:
    """Whether ``result`` gets a reward: scored (``is_scored``) and its speed judged (see the
    module docstring), whatever the components: which of them read the timing, a custom one
    included, cannot be told from here."""
    return is_scored(result) and not speed_unjudged(result)


def reward_components(
    result: EvalResult | dict[str, Any], config: RewardConfig | None = None
) -> dict[str, float]:
    """Every component of one result, unweighted, in component order; all NaN for a result
    that gets no reward (``rewarded``: a ``harness_error``, or its speed not judged)."""
    config = config or RewardConfig()
    result = as_eval_result(result)
    selected = components_of(config)
    if not rewarded(result):
        return {c.name: math.nan for c in selected}
    return {c.name: float(c.score(result, config)) for c in selected}


def total_reward(result: EvalResult | dict[str, Any], config: RewardConfig | None = None) -> float:
    """The scalar reward of one result (one turn): ``weighted_total`` of its components; NaN
    for an unscored result (``harness_error``), never 0."""
    config = config or RewardConfig()
    values = reward_components(result, config)
    weights = reward_weights(config)
    total = weighted_total(
        torch.tensor(list(values.values()), dtype=torch.float64), [weights[n] for n in values]
    )
    return float(total.item())
