"""RewardConfig: weights and shaping of the reward components, set from a recipe.

Flat scalar fields only, so TRL's parser (HfArgumentParser) can fill it from YAML keys and
``--key value`` flags next to GRPOConfig.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SPEEDUP_BASELINES = ("eager", "compile")

#: The reward components, in the order ``build_reward_funcs`` returns them.
COMPONENT_NAMES = (
    "format_reward",
    "correctness_reward",
    "speedup_reward",
    "profiling_reward",
    "integrity_penalty",
)


@dataclass
class RewardConfig:
    """How EvalResults become scalar rewards.

    The total reward is ``sum(weight_c * component_c)``; components are logged unweighted.
    Defaults keep the ordering a policy should learn: a correct kernel, even a slow one, scores
    at least as much as an incorrect one (``correctness_weight >= -speedup_weight *
    speedup_clip_min``), and a cheating one scores less than an honest failure.
    """

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
        default=-1.0, metadata={"help": "lower clip of log2(speedup): -1 means 2x slower or worse"}
    )
    speedup_clip_max: float = field(
        default=3.0, metadata={"help": "upper clip of log2(speedup): 3 means 8x faster or better"}
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
        if self.speedup_baseline not in SPEEDUP_BASELINES:
            raise ValueError(
                f"speedup_baseline must be one of {SPEEDUP_BASELINES}, got {self.speedup_baseline!r}"
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

    def weights(self) -> dict[str, float]:
        """Component name -> weight, in ``COMPONENT_NAMES`` order."""
        return {
            "format_reward": self.format_weight,
            "correctness_reward": self.correctness_weight,
            "speedup_reward": self.speedup_weight,
            "profiling_reward": self.profiling_weight,
            "integrity_penalty": self.integrity_weight,
        }
