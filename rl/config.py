"""The configuration of a training run: several dataclasses, one flat recipe.

As TRL's scripts do, a recipe is one flat YAML parsed by ``trl.TrlParser`` into several
dataclasses at once (``TRAIN_RECIPE``: ``KernelGRPOConfig``, ``kernelrl.rewards.RewardConfig``,
``RejectionSampling``, ``EnvPoolConfig`` and TRL's ``ModelConfig``), every key overridable with
``--key value``. Each part is defined once, next to its use, and checks its own keys (the
reward preset and the reward keys it defines: ``RewardConfig``); ``KernelGRPOConfig.compose``
hangs the parsed parts on the training arguments (``args.reward``, ``args.rejection``,
``args.environment``), so that the trainer and TRL receive one ``args`` object; ``args.to_dict()`` (the logged run config)
holds every part's keys. ``train_config(**keys)`` does the same from a flat mapping.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from trl import GRPOConfig, ModelConfig

from kernelrl.env.pools import EnvPoolConfig
from kernelrl.prompts import MultiTurnConfig
from kernelrl.rewards import RewardConfig, components_of
from kernelrl.rl.advantages import ADVANTAGE_ESTIMATORS
from kernelrl.rl.rejection import RejectionSampling

ADVANTAGES = ADVANTAGE_ESTIMATORS  # grpo, trloo (ours), drkernel_trloo (Dr. Kernel's, exactly)
TURN_RETURNS = ("own", "discounted")


@dataclass
class KernelGRPOConfig(MultiTurnConfig, GRPOConfig):
    """GRPOConfig for kernel-writing policies: environment rewards, multi-turn (the keys
    evaluation shares: ``MultiTurnConfig``), TRLOO."""

    # ------------------------------------------------------------------ algorithm
    advantage: str = field(
        default="trloo",
        metadata={
            "help": "'grpo' (group mean/std, as TRL), 'trloo' (turn-level leave-one-out baseline) "
            "or 'drkernel_trloo' (Dr. Kernel's TRLOO exactly: returns-to-go with turn_gamma, a "
            "sample alone at its turn keeps its return, rejected turns stay in the baselines)"
        },
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
    async_generation: bool = field(
        default=False,
        metadata={
            "help": "asynchronous RL: generation for the next steps runs while the update trains, "
            "each turn is judged as it finishes, a step trains on the groups that are complete and "
            "the others carry over; samples at most max_staleness policy versions old, corrected "
            "by importance weights (TRL's vllm_importance_sampling_* keys)"
        },
    )
    max_staleness: int = field(
        default=1,
        metadata={
            "help": "async_generation: how many optimizer steps older than the update a trained "
            "sample's oldest turn may be; 0 gives the synchronous trainer's samples and update"
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
    compile_generation: bool = field(
        default=False,
        metadata={
            "help": "transformers generation (use_vllm: false) on a GPU: decode with a static KV "
            "cache and transformers' compiled, CUDA-graphed step, from a merged copy of a LoRA "
            "policy kept across steps and refreshed in place (the graphs hold its weights)"
        },
    )
    save_rollouts: bool = field(
        default=False,
        metadata={
            "help": "write every trained rollout (completions, environment results, rewards, "
            "advantages) to output_dir/rollouts/rank<N>.jsonl, in curation's trajectory format"
        },
    )
    stop_after_s: float | None = field(
        default=None,
        metadata={
            "help": "end training, with a checkpoint, at the first step that ends this many "
            "seconds after training started: for jobs with a time limit (a SLURM slot, a lent "
            "machine); rerun with resume_from_checkpoint to go on"
        },
    )

    max_nonfinite_grad_steps: int = field(
        default=3,
        metadata={
            "help": "an optimizer step whose gradients hold NaN or inf is skipped (the weights "
            "stay as they were); this many such steps in a row stop training with an error"
        },
    )

    # ------------------------------------------------------------------ composed parts
    # Parsed as their own dataclasses next to this one (TRAIN_RECIPE); set by ``compose``.
    reward: RewardConfig = field(default_factory=RewardConfig, init=False, repr=False)
    rejection: RejectionSampling = field(default_factory=RejectionSampling, init=False, repr=False)
    environment: EnvPoolConfig = field(default_factory=EnvPoolConfig, init=False, repr=False)

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
    task_difficulty: str = field(
        default="",
        metadata={
            "help": "comma-separated difficulty tags to keep (easy, medium, hard; default: all)"
        },
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
        _choice("turn_return", self.turn_return, TURN_RETURNS)
        self.check_turns()
        self._check_async()
        if not 0.0 <= self.turn_gamma <= 1.0:
            raise ValueError(f"turn_gamma must lie in [0, 1], got {self.turn_gamma}")
        if isinstance(self.vllm_engine_kwargs, str):
            self.vllm_engine_kwargs = json.loads(self.vllm_engine_kwargs)
        if self.max_context_tokens is None:
            self.max_context_tokens = self.vllm_max_model_length
        if self.reward_weights is not None:
            raise ValueError(
                "set the reward weights with format_weight, correctness_weight, speedup_weight, "
                "profiling_weight and integrity_weight, not reward_weights"
            )
        if self.advantage == "drkernel_trloo" and self.turn_return != "own":
            raise ValueError(
                "advantage=drkernel_trloo always uses returns-to-go G_t = r_t + turn_gamma * "
                "G_{t+1}; remove turn_return (set turn_gamma instead)"
            )

    def compose(
        self, reward: RewardConfig, rejection: RejectionSampling, environment: EnvPoolConfig
    ) -> KernelGRPOConfig:
        """Hang the parts parsed next to this config on it (each checked its own keys)."""
        components_of(reward)  # a bad reward_funcs name or import path fails at parse time
        self.reward, self.rejection, self.environment = reward, rejection, environment
        self.check_overlap()
        return self

    def _check_async(self) -> None:
        """What asynchronous training cannot honour is refused, never ignored."""
        if not self.async_generation:
            return
        problems = {
            "max_staleness must be >= 0": self.max_staleness < 0,
            "async_generation already overlaps evaluation: remove overlap_evaluation": (
                self.overlap_evaluation
            ),
            "async_generation trains each sample once: set num_iterations: 1": (
                self.num_iterations != 1
            ),
            "async_generation generates once per optimizer step: remove steps_per_generation or "
            "set it to gradient_accumulation_steps": (
                self.steps_per_generation != self.gradient_accumulation_steps
            ),
            "async_generation carries whole groups over: per_device_train_batch_size x "
            "steps_per_generation must be a multiple of num_generations": (
                (self.per_device_train_batch_size * self.steps_per_generation)
                % self.num_generations
                != 0
            ),
            "stale samples need vLLM's importance-sampling correction: set "
            "vllm_importance_sampling_correction: true or max_staleness: 0": (
                self.use_vllm
                and not self.vllm_importance_sampling_correction
                and self.max_staleness > 0
            ),
            "async_generation with a colocated engine needs vllm_tensor_parallel_size: 1 and no "
            "vllm_enable_sleep_mode (generation runs while the update trains)": (
                self.use_vllm
                and self.vllm_mode == "colocate"
                and (self.vllm_tensor_parallel_size != 1 or self.vllm_enable_sleep_mode)
            ),
        }
        for problem, present in problems.items():
            if present:
                raise ValueError(problem)

    def check_overlap(self) -> None:
        """Overlapped evaluation only where kernels are not timed on the policy's own GPUs."""
        if self.async_generation and self.environment.times_on_local_gpus():
            raise ValueError(
                "async_generation would time kernels while the policy generates and trains on the "
                "same GPUs (env_pool: local or process, env_device: cuda); evaluate on other GPUs "
                "(env_pool: ray or service)"
            )
        if self.overlap_evaluation and self.environment.times_on_local_gpus():
            raise ValueError(
                "overlap_evaluation would time kernels while the policy generates and trains on "
                "the same GPUs (env_pool: local, env_device: cuda): the timings, and the integrity "
                "checks that compare them, would measure the policy too. Turn overlap_evaluation "
                "off, or evaluate on other GPUs (env_pool: ray or service)"
            )

    def environment_gpus(self) -> list[int] | None:
        """The GPUs this process's own local pool evaluates on: where several trainer
        processes share the host's GPUs, each rank's kernels are timed on its own GPU, never on
        the GPU where another rank's policy generates and trains at that moment."""
        if self.world_size > 1 and self.environment.times_on_local_gpus():
            return [self.local_process_index]
        return None

    def to_dict(self) -> dict[str, Any]:
        """TRL's keys and the parts' (what the run logs as its config names every recipe key)."""
        out = super().to_dict()
        for part in (self.reward, self.rejection, self.environment):
            out.update(dataclasses.asdict(part))
        return out

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
        """TRL options that kernelrl cannot honour: refused, never ignored."""
        if self.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError(
                f"multi_objective_aggregation={self.multi_objective_aggregation} is not supported: "
                "kernelrl sums the weighted reward components of each turn, then computes "
                "advantages; remove multi_objective_aggregation"
            )
        truncated = [
            f"{name}={value}"
            for name, value, on in (
                ("top_p", self.top_p, self.top_p < 1.0),
                ("top_k", self.top_k, self.top_k not in (None, 0, -1)),
                ("min_p", self.min_p, bool(self.min_p)),
            )
            if on
        ]
        if self.compile_generation and self.use_vllm:
            raise ValueError(
                "compile_generation is for transformers generation; vLLM compiles its own decode "
                "(enforce_eager in vllm_engine_kwargs): set one of use_vllm, compile_generation"
            )
        if self.use_vllm and self.vllm_importance_sampling_correction and truncated:
            # vLLM reports log-probabilities of the truncated distribution it sampled from, TRL
            # recomputes them over the whole vocabulary: every token's ratio is < 1 and their
            # product over a long completion scales its gradient towards 0 (docs/decisions.md).
            raise ValueError(
                f"{', '.join(truncated)} with vLLM's importance-sampling correction biases every "
                "ratio (TRL's log-probabilities ignore truncation); sample with top_p: 1.0, "
                "top_k: 0 and no min_p, or set vllm_importance_sampling_correction: false"
            )

    def reward_config(self) -> RewardConfig:
        """The reward trained on: ``self.reward`` (its preset already applied)."""
        return self.reward


#: The dataclasses a training recipe is parsed into, in the order the parser returns them.
TRAIN_RECIPE = (KernelGRPOConfig, RewardConfig, RejectionSampling, EnvPoolConfig, ModelConfig)


def train_config(**keys: Any) -> KernelGRPOConfig:
    """``KernelGRPOConfig`` with its parts, from the flat keys a recipe would hold (TRL's
    parser splits them between the dataclasses; a key none of them knows is an error)."""
    from trl import TrlParser

    args, reward, rejection, environment = TrlParser(TRAIN_RECIPE[:-1]).parse_dict(keys)
    return args.compose(reward, rejection, environment)


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def compose_recipe(parsed: tuple[Any, ...]) -> tuple[KernelGRPOConfig, ModelConfig]:
    """(training arguments with their parts, model arguments) from what the parser returns for
    ``TRAIN_RECIPE``."""
    args, reward, rejection, environment, model = parsed
    return args.compose(reward, rejection, environment), model
