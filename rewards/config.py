"""RewardConfig: which reward components a run scores, their weights and shaping, and the
named reward definitions (``reward_preset``), set from a recipe.

Flat fields only, so TRL's parser (HfArgumentParser) can fill it from YAML keys and
``--key value`` flags next to GRPOConfig. A preset is applied here, when the config is built,
so every reader - training, evaluation, scripts - sees the reward's real weights and bounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

SPEEDUP_BASELINES = ("eager", "compile")

#: How a speedup becomes the speedup component: ``log2`` (ours, clipped log2) or ``linear``
#: (Dr. Kernel: the speedup itself, capped; a speedup under the lower bound earns nothing).
SPEEDUP_TRANSFORMS = ("log2", "linear")

#: Named reward definitions: ``kernelrl`` (the weights and shaping set field by field) and
#: ``drkernel`` (the reward KernelGYM's Dr. Kernel recipes ship, see ``drkernel_reward_config``).
REWARD_PRESETS = ("kernelrl", "drkernel")

#: What ``reward_preset: drkernel`` sets (see ``drkernel_reward_config``). Format and integrity
#: carry weight 0; ``speedup_clip_max`` (the cap), ``speedup_baseline`` and
#: ``profiling_cpu_fallback`` stay the recipe's.
DRKERNEL_KEYS: dict[str, Any] = {
    "format_weight": 0.0,
    "correctness_weight": 0.5,
    "speedup_weight": 0.5,
    "profiling_weight": 0.5,
    "integrity_weight": 0.0,
    "speedup_clip_min": 0.0,
    "speedup_transform": "linear",
    "integrity_penalty_per_check": 1.0,
}


@dataclass
class RewardConfig:
    """How EvalResults become scalar rewards.

    The total reward is ``sum(weight_c * component_c)`` (``kernelrl.rewards.weighted_total``);
    components are logged unweighted. Defaults keep the ordering a policy should learn: a
    correct kernel, even a slow one, scores at least as much as an incorrect one
    (``correctness_weight >= -speedup_weight * speedup_clip_min``), and a cheating one scores
    less than an honest failure.
    """

    #: Recipe keys that were replaced: old key -> the key to set instead (a recipe that sets the
    #: old key is refused with a one-line error naming the new one, ``kernelrl.launch.recipe``).
    RENAMED_KEYS: ClassVar[dict[str, str]] = {"drkernel_speedup_cap": "speedup_clip_max"}

    reward_preset: str = field(
        default="kernelrl",
        metadata={
            "help": "'kernelrl' (the *_weight and speedup_* keys) or 'drkernel' (Dr. Kernel's "
            "shipped reward: 0.5*correct + 0.5*min(speedup, speedup_clip_max) + "
            "0.5*own_kernel_share when correct, else 0)"
        },
    )
    reward_funcs: list[str] | None = field(
        default=None,
        metadata={
            "help": "the reward components, as TRL's reward_funcs: registered names "
            "(format_reward, correctness_reward, speedup_reward, profiling_reward, "
            "integrity_penalty) or dotted import paths to a kernelrl.rewards.Component or a "
            "scorer f(EvalResult, RewardConfig) -> float (weight 1). Default: every built-in"
        },
    )

    format_weight: float = field(
        default=0.1, metadata={"help": "weight of format_reward (parseable ModelNew)"}
    )
    correctness_weight: float = field(
        default=1.0, metadata={"help": "weight of correctness_reward"}
    )
    speedup_weight: float = field(default=1.0, metadata={"help": "weight of speedup_reward"})
    profiling_weight: float = field(
        default=0.5,
        metadata={"help": "weight of profiling_reward (own kernels' share of GPU time)"},
    )
    integrity_weight: float = field(
        default=1.0, metadata={"help": "weight of integrity_penalty (the component itself is <= 0)"}
    )
    speedup_baseline: str = field(
        default="eager",
        metadata={"help": "speedup reference: 'eager' or 'compile' (torch.compile)"},
    )
    speedup_clip_min: float = field(
        default=-1.0,
        metadata={
            "help": "log2: lower clip of log2(speedup), -1 means 2x slower or worse; linear: a "
            "speedup under this bound scores 0"
        },
    )
    speedup_clip_max: float = field(
        default=3.0,
        metadata={
            "help": "the speedup cap, under every reward_preset. log2: upper clip of "
            "log2(speedup), 3 means 8x faster or better; linear (drkernel): cap of the speedup"
        },
    )
    speedup_transform: str = field(
        default="log2",
        metadata={
            "help": "'log2' (clipped log2 speedup) or 'linear' (the speedup capped at "
            "speedup_clip_max, 0 under speedup_clip_min; Dr. Kernel's)"
        },
    )
    integrity_penalty_per_check: float = field(
        default=1.0, metadata={"help": "penalty per failed integrity check (component = -this * n)"}
    )
    profiling_cpu_fallback: float = field(
        default=1.0,
        metadata={
            "help": "profiling_reward of a correct result without a profile (CPU), whose own "
            "kernels ran on every call with no torch compute fallback; 0 disables"
        },
    )

    def __post_init__(self) -> None:
        if self.reward_preset not in REWARD_PRESETS:
            raise ValueError(
                f"reward_preset must be one of {REWARD_PRESETS}, got {self.reward_preset!r}"
            )
        if self.reward_preset == "drkernel":
            self._apply(DRKERNEL_KEYS)
        if self.speedup_baseline not in SPEEDUP_BASELINES:
            raise ValueError(
                f"speedup_baseline must be one of {SPEEDUP_BASELINES}, got {self.speedup_baseline!r}"
            )
        if self.speedup_transform not in SPEEDUP_TRANSFORMS:
            raise ValueError(
                f"speedup_transform must be one of {SPEEDUP_TRANSFORMS}, got {self.speedup_transform!r}"
            )
        if self.speedup_clip_min > self.speedup_clip_max:
            raise ValueError(
                f"speedup_clip_min ({self.speedup_clip_min}) must not exceed "
                f"speedup_clip_max ({self.speedup_clip_max})"
            )
        if self.integrity_penalty_per_check < 0:
            raise ValueError("integrity_penalty_per_check must be >= 0 (the component is -penalty)")
        if not 0.0 <= self.profiling_cpu_fallback <= 1.0:
            raise ValueError("profiling_cpu_fallback must lie in [0, 1], like a kernel-time share")

    def _apply(self, preset: dict[str, Any]) -> None:
        """Set the preset's keys; a key the recipe set to another value is refused (the preset
        would silently override it). Idempotent, so ``dataclasses.replace`` keeps working."""
        defaults = {f.name: f.default for f in fields(self) if f.name in preset}
        changed = [
            key for key, value in preset.items() if getattr(self, key) not in (defaults[key], value)
        ]
        if self.reward_funcs is not None:
            changed.append("reward_funcs")
        if changed:
            raise ValueError(
                f"reward_preset={self.reward_preset} defines {', '.join(changed)}; remove "
                f"{'them' if len(changed) > 1 else 'it'} or set reward_preset: kernelrl"
            )
        for key, value in preset.items():
            setattr(self, key, value)


def drkernel_reward_config(
    speedup_baseline: str = "eager",
    speedup_clip_max: float = 3.0,
    profiling_cpu_fallback: float = 1.0,
) -> RewardConfig:
    """The reward Dr. Kernel ships (KernelGYM ``calculate_reward_speedup`` with the 14B recipe's
    settings: ``init_correct_weight=0.5``, ``init_performance_weight=0.5``, speedup bounds
    [0, 3], ``coverage_reward`` ``time_coverage`` at weight 0.5, ``penalty_score=0``), as our
    components:

        r = 0.5 * correct + 0.5 * min(speedup, 3) + 0.5 * own_kernel_share   if correct
        r = 0                                                               otherwise

    ``correctness_reward`` carries ``correct``, ``speedup_reward`` (linear transform, cap
    ``speedup_clip_max``, lower bound 0) ``min(speedup, 3)`` and ``profiling_reward`` the share of GPU
    time in the solution's own kernels (their ``time_coverage``); the speedup and profiling
    components are already 0 unless the result is correct. Format and integrity carry weight 0:
    their failure (compile error, wrong output, decoy kernel or any other hack) scores 0, not a
    penalty. Differences that remain, by necessity: a speedup counts only where timings mean
    something (a GPU), and on CPU, where no profile exists, the share is our
    ``profiling_cpu_fallback`` (KernelGYM never runs on CPU; its missing profile reads 0).
    """
    return RewardConfig(
        reward_preset="drkernel",
        speedup_baseline=speedup_baseline,
        speedup_clip_max=speedup_clip_max,
        profiling_cpu_fallback=profiling_cpu_fallback,
    )
