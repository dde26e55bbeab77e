"""KernelGRPOConfig: TRL's GRPOConfig plus what kernel RL adds.

One flat dataclass, so a recipe is one flat YAML parsed by ``trl.TrlParser`` and every key can be
overridden with ``--key value``. The reward and rejection fields mirror
``kernelrl.rewards.RewardConfig`` and ``kernelrl.rl.rejection.RejectionConfig`` (the rejection
fields carry a ``rejection_`` prefix because their own names - ``mode``, ``weight`` - are too
generic for a flat recipe); ``reward_config()`` and ``rejection_config()`` build those objects.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields

from trl import GRPOConfig

from kernelrl.env.pools import EVALS_PER_GPU, POOL_KINDS
from kernelrl.prompts import FEEDBACK_TEMPLATE
from kernelrl.rewards import REWARD_PRESETS, RewardConfig, drkernel_reward_config
from kernelrl.rl.advantages import ADVANTAGE_ESTIMATORS
from kernelrl.rl.rejection import REJECTION_PRESETS, DrKernelRejectionConfig, RejectionConfig

ADVANTAGES = ADVANTAGE_ESTIMATORS  # grpo, trloo (ours), drkernel_trloo (Dr. Kernel's, exactly)
TURN_RETURNS = ("own", "discounted")


@dataclass
class KernelGRPOConfig(GRPOConfig):
    """GRPOConfig for kernel-writing policies: environment rewards, multi-turn, TRLOO."""

    # ------------------------------------------------------------------ algorithm
    advantage: str = field(
        default="trloo",
        metadata={
            "help": "'grpo' (group mean/std, as TRL), 'trloo' (turn-level leave-one-out baseline) "
            "or 'drkernel_trloo' (Dr. Kernel's TRLOO exactly: returns-to-go with turn_gamma, a "
            "sample alone at its turn keeps its return, rejected turns stay in the baselines)"
        },
    )
    max_turns: int = field(
        default=1,
        metadata={"help": "turns per rollout: write, get the environment's feedback, revise"},
    )
    turn_return: str = field(
        default="own",
        metadata={
            "help": "credit of a turn: 'own' (its reward) or 'discounted' (sum of later rewards)"
        },
    )
    turn_gamma: float = field(
        default=1.0,
        metadata={"help": "discount of later turns' rewards when turn_return=discounted"},
    )
    stop_when_correct: bool = field(
        default=True, metadata={"help": "end a rollout at its first correct turn"}
    )
    feedback_template: str = field(
        default=FEEDBACK_TEMPLATE,
        metadata={"help": "next user message; {feedback} is the environment's feedback text"},
    )
    max_feedback_tokens: int = field(
        default=512, metadata={"help": "feedback longer than this is cut (its middle is dropped)"}
    )
    max_context_tokens: int | None = field(
        default=None,
        metadata={
            "help": "context budget of a rollout (prompt + all turns); a turn gets at most what is "
            "left, and no turn starts with less than min_turn_tokens left. Default: "
            "vllm_max_model_length, else unlimited"
        },
    )
    min_turn_tokens: int = field(
        default=64, metadata={"help": "a turn that would get fewer tokens than this is not started"}
    )
    overlap_evaluation: bool = field(
        default=False,
        metadata={
            "help": "one-step off-policy: the next batch is generated while this batch's last turn is "
            "evaluated; its update then uses samples one step stale (logged as rollout/staleness)"
        },
    )
    vllm_engine_kwargs: dict | str | None = field(
        default=None,
        metadata={
            "help": "extra keyword arguments of the colocated vLLM engine, e.g. "
            '{"enforce_eager": true} (JSON on the command line)'
        },
    )
    seeded_sampling: bool = field(
        default=True,
        metadata={
            "help": "colocated vLLM: one seed per request derived from `seed` and the rollout "
            "counter, so a resumed run samples exactly what the uninterrupted run would"
        },
    )

    # ------------------------------------------------------------------ rewards
    format_weight: float = field(default=0.1, metadata={"help": "weight of format_reward"})
    correctness_weight: float = field(
        default=1.0, metadata={"help": "weight of correctness_reward"}
    )
    speedup_weight: float = field(default=1.0, metadata={"help": "weight of speedup_reward"})
    profiling_weight: float = field(default=0.5, metadata={"help": "weight of profiling_reward"})
    integrity_weight: float = field(default=1.0, metadata={"help": "weight of integrity_penalty"})
    speedup_baseline: str = field(
        default="eager", metadata={"help": "speedup reference: 'eager' or 'compile'"}
    )
    speedup_clip_min: float = field(default=-1.0, metadata={"help": "lower clip of log2(speedup)"})
    speedup_clip_max: float = field(default=3.0, metadata={"help": "upper clip of log2(speedup)"})
    integrity_penalty_per_check: float = field(
        default=1.0, metadata={"help": "penalty per failed integrity check"}
    )
    profiling_cpu_fallback: float = field(
        default=1.0, metadata={"help": "profiling_reward of a correct CPU result (no profile)"}
    )

    reward_preset: str = field(
        default="kernelrl",
        metadata={
            "help": "'kernelrl' (the *_weight and speedup_* keys) or 'drkernel' (Dr. Kernel's "
            "shipped reward: 0.5*correct + 0.5*min(speedup, drkernel_speedup_cap) + "
            "0.5*own_kernel_share when correct, else 0)"
        },
    )
    drkernel_speedup_cap: float = field(
        default=3.0, metadata={"help": "reward_preset=drkernel: cap of the speedup term"}
    )

    # ------------------------------------------------------------------ rejection sampling
    rejection_sampling: bool = field(
        default=True,
        metadata={"help": "drop or down-weight cheating and lazy (low own-kernel share) samples"},
    )
    rejection_min_own_kernel_share: float = field(
        default=0.5, metadata={"help": "reject correct samples whose kernels did less of the work"}
    )
    rejection_drop_integrity_violations: bool = field(
        default=True, metadata={"help": "reject integrity violations"}
    )
    rejection_mode: str = field(
        default="drop", metadata={"help": "'drop' (weight 0) or 'downweight' (rejection_weight)"}
    )
    rejection_weight: float = field(
        default=0.1, metadata={"help": "weight of a rejected sample in downweight mode"}
    )
    rejection_preset: str = field(
        default="kernelrl",
        metadata={
            "help": "'kernelrl' (the rejection_* keys above) or 'drkernel' (Dr. Kernel's PRS: keep "
            "a correct turn with probability clamp((share - drkernel_prs_threshold) / "
            "drkernel_prs_ramp, 0, 1); a rejected turn's tokens leave the loss)"
        },
    )
    drkernel_prs_threshold: float = field(
        default=0.3, metadata={"help": "rejection_preset=drkernel: share at or under which to drop"}
    )
    drkernel_prs_ramp: float = field(
        default=0.1, metadata={"help": "rejection_preset=drkernel: share ramp to always keeping"}
    )

    # ------------------------------------------------------------------ environment pool
    env_pool: str = field(
        default="local",
        metadata={
            "help": "'local' (subprocesses here), 'ray' (actors on the cluster's GPUs) or "
            "'service' (a running `kernelrl env serve`)"
        },
    )
    env_device: str = field(default="auto", metadata={"help": "cpu, cuda or auto"})
    env_workers: int | None = field(
        default=None, metadata={"help": "CPU slots or GPUs of the pool (default: all)"}
    )
    env_per_gpu: int = field(
        default=EVALS_PER_GPU, metadata={"help": "evaluations in flight per GPU"}
    )
    env_timeout_s: float = field(default=180.0, metadata={"help": "seconds for one evaluation"})
    env_ray_address: str | None = field(
        default=None, metadata={"help": "Ray cluster to join (ray/service pools)"}
    )
    env_service_name: str = field(
        default="kernelrl-env", metadata={"help": "name of the environment service"}
    )
    env_store_path: str | None = field(
        default=None, metadata={"help": "results store shared with sweeps and curation"}
    )

    # ------------------------------------------------------------------ tasks (read by launch)
    tasks: list[str] = field(
        default_factory=lambda: ["bundled"],
        metadata={
            "help": "task sources: 'bundled' or loader specs (kernelbench:DIR, jsonl:FILE, "
            "parquet:..., disk:..., hub:ORG/NAME#SPLIT)"
        },
    )
    task_filter: str = field(
        default="", metadata={"help": "comma-separated substrings; keep tasks whose id has one"}
    )
    task_categories: str = field(
        default="", metadata={"help": "comma-separated categories to keep (default: all)"}
    )
    max_tasks: int | None = field(default=None, metadata={"help": "keep the first N tasks"})
    task_backend: str = field(default="triton", metadata={"help": "triton or cuda"})
    prompt_template: str | None = field(
        default=None,
        metadata={"help": "prompt template file ($reference, $backend_name, $example, ...)"},
    )
    system_prompt: str | None = field(
        default="default",
        metadata={"help": "'default', a system message, or 'none' for no system message"},
    )

    scale_rewards: str | None = field(
        default=None,
        metadata={
            "help": "advantage=grpo: 'group' (default: divide by the group's std per turn) or "
            "'none'; the TRLOO estimators never scale ('none', their default). 'batch' is not "
            "supported: advantages are computed per group and turn"
        },
    )

    def __post_init__(self) -> None:
        self._resolve_scale_rewards()
        super().__post_init__()
        self._check_honoured()
        _choice("advantage", self.advantage, ADVANTAGES)
        _choice("reward_preset", self.reward_preset, REWARD_PRESETS)
        _choice("rejection_preset", self.rejection_preset, REJECTION_PRESETS)
        self._check_presets()
        _choice("turn_return", self.turn_return, TURN_RETURNS)
        _choice("env_pool", self.env_pool, POOL_KINDS)
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if not 0.0 <= self.turn_gamma <= 1.0:
            raise ValueError(f"turn_gamma must lie in [0, 1], got {self.turn_gamma}")
        if "{feedback}" not in self.feedback_template:
            raise ValueError("feedback_template must contain {feedback}")
        if isinstance(self.vllm_engine_kwargs, str):
            self.vllm_engine_kwargs = json.loads(self.vllm_engine_kwargs)
        if self.max_context_tokens is None:
            self.max_context_tokens = self.vllm_max_model_length
        if self.reward_weights is not None:
            raise ValueError(
                "set the reward weights with format_weight, correctness_weight, speedup_weight, "
                "profiling_weight and integrity_weight, not reward_weights"
            )
        # Build both once here so that a bad value fails when the recipe is parsed.
        self.reward_config()
        self.rejection_config()
        self.drkernel_rejection_config()

    def _resolve_scale_rewards(self) -> None:
        """The estimator's own default; a value it would ignore is an error, not a no-op."""
        value = {True: "group", False: "none", "true": "group", "false": "none"}.get(
            self.scale_rewards, self.scale_rewards
        )
        if value is None:
            value = "group" if self.advantage == "grpo" else "none"
        if value == "batch":
            raise ValueError(
                "scale_rewards=batch is not supported: kernelrl computes advantages per group and "
                "turn; use scale_rewards: group or none"
            )
        if value not in ("group", "none"):
            raise ValueError(f"scale_rewards must be one of ('group', 'none'), got {value!r}")
        if value == "group" and self.advantage != "grpo":
            raise ValueError(
                f"advantage={self.advantage} does not divide by a std; remove scale_rewards or "
                "set scale_rewards: none"
            )
        self.scale_rewards = value

    def _check_honoured(self) -> None:
        """TRL options that the turn-level advantages replace: refused, never ignored."""
        if self.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError(
                f"multi_objective_aggregation={self.multi_objective_aggregation} is not supported: "
                "kernelrl sums the weighted reward components of each turn, then computes "
                "advantages; remove multi_objective_aggregation"
            )

    def _check_presets(self) -> None:
        """A preset defines its part exactly: a key it would ignore, set to another value than
        its default, is an error (no silent option change)."""
        defaults = {f.name: f.default for f in fields(KernelGRPOConfig)}
        owned = {
            "reward_preset": _REWARD_KEYS,
            "rejection_preset": _REJECTION_KEYS,
        }
        for preset_key, keys in owned.items():
            if getattr(self, preset_key) != "drkernel":
                continue
            changed = [k for k in keys if getattr(self, k) != defaults[k]]
            if changed:
                raise ValueError(
                    f"{preset_key}=drkernel defines {', '.join(changed)}; remove "
                    f"{'them' if len(changed) > 1 else 'it'} or set {preset_key}: kernelrl"
                )
        if self.advantage == "drkernel_trloo" and self.turn_return != defaults["turn_return"]:
            raise ValueError(
                "advantage=drkernel_trloo always uses returns-to-go G_t = r_t + turn_gamma * "
                "G_{t+1}; remove turn_return (set turn_gamma instead)"
            )

    def reward_config(self) -> RewardConfig:
        if self.reward_preset == "drkernel":
            return drkernel_reward_config(
                speedup_baseline=self.speedup_baseline,
                speedup_cap=self.drkernel_speedup_cap,
                profiling_cpu_fallback=self.profiling_cpu_fallback,
            )
        return RewardConfig(
            format_weight=self.format_weight,
            correctness_weight=self.correctness_weight,
            speedup_weight=self.speedup_weight,
            profiling_weight=self.profiling_weight,
            integrity_weight=self.integrity_weight,
            speedup_baseline=self.speedup_baseline,
            speedup_clip_min=self.speedup_clip_min,
            speedup_clip_max=self.speedup_clip_max,
            integrity_penalty_per_check=self.integrity_penalty_per_check,
            profiling_cpu_fallback=self.profiling_cpu_fallback,
        )

    def drkernel_rejection_config(self) -> DrKernelRejectionConfig:
        return DrKernelRejectionConfig(
            threshold=self.drkernel_prs_threshold, ramp=self.drkernel_prs_ramp
        )

    def rejection_config(self) -> RejectionConfig:
        return RejectionConfig(
            min_own_kernel_share=self.rejection_min_own_kernel_share,
            drop_integrity_violations=self.rejection_drop_integrity_violations,
            mode=self.rejection_mode,
            weight=self.rejection_weight,
        )


#: Keys whose meaning a ``drkernel`` preset replaces (kept at their defaults under it).
_REWARD_KEYS = (
    "format_weight",
    "correctness_weight",
    "speedup_weight",
    "profiling_weight",
    "integrity_weight",
    "speedup_clip_min",
    "speedup_clip_max",
    "integrity_penalty_per_check",
)
_REJECTION_KEYS = (
    "rejection_min_own_kernel_share",
    "rejection_drop_integrity_violations",
    "rejection_mode",
    "rejection_weight",
)


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
