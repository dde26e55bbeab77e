"""The trainer's side of asynchronous RL (``async_generation``): what ``KernelGRPOTrainer``
calls at each step, kept out of the trainer shell.

At each optimizer step ``t`` (``step``): the generator takes the weights of step ``t``
(``AsyncRollouts.publish``: TRL's own weight sync into vLLM, or a refreshed copy of the policy),
the batch TRL hands this step and the next ``max_staleness`` ones are queued for generation (in
data order, each with its sampling seeds), and the step gets the complete groups the schedule
picks, possibly of earlier batches. After TRL has scored them, ``correct`` weights the tokens of
stale turns by ``pi_old / mu`` where TRL does not already: with vLLM, TRL's own
importance-sampling correction compares the logprobs vLLM sampled with to the policy's at
scoring time, which is the same ratio; with transformers generation the generator's copy
scored its samples (the behaviour log-probabilities) and the policy scores them here.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from kernelrl.env.task import task_from_row
from kernelrl.rl import compat
from kernelrl.rl.async_generate import make_generator, token_logprobs
from kernelrl.rl.async_rollout import AsyncRollouts, Taken
from kernelrl.rl.async_schedule import importance_weights
from kernelrl.rl.rollout import MultiTurnRollout, Trajectory


class AsyncTraining:
    """Asynchronous generation for one ``KernelGRPOTrainer`` (see the module docstring)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.args = trainer.args
        base = trainer.rollout
        # A tokenizer of its own: TRL's main-thread tokenization may set padding options while
        # a rollout thread encodes, which the Rust tokenizer refuses ("Already borrowed").
        rollout = MultiTurnRollout(
            copy.deepcopy(base.tokenizer),
            base.pool,
            base.config,
            base.eos_token_ids,
            base.chat_template_kwargs,
        )
        self.engine = AsyncRollouts(
            rollout, make_generator(trainer), self.args.max_staleness, trainer.num_generations
        )
        self._submitted: dict[int, Any] = {}  # id(batch) -> batch (kept alive: ids stay unique)
        self._next_order: int | None = None
        self._published: int | None = None

    def batches_ahead(self) -> int:
        """Generation batches read ahead of the one being trained."""
        return max(self.args.max_staleness, 1)

    def paused(self) -> Any:
        return self.engine.paused()

    def step(self, inputs: list[dict[str, Any]]) -> Taken:
        """The rows and rollouts optimizer step ``global_step`` trains (module docstring)."""
        trainer = self.trainer
        step = trainer.state.global_step
        if self._published != step:
            self.engine.publish(step)
            self._published = step
        if self._next_order is None:
            self._next_order = step  # a resumed run's first batch is trained at its step
        upcoming = trainer.upcoming_inputs(inputs, self.args.max_staleness)
        for batch in [inputs, *upcoming]:
            if id(batch) not in self._submitted:
                self._submit(batch)
        taken = self.engine.take(step, len(inputs))
        metrics = compat.metrics(trainer, "train")
        ages = [step - t.policy_step for t in taken.batch.trajectories]
        metrics["async/staleness_max"].append(float(max(ages, default=0)))
        metrics["async/carried_groups"].append(float(taken.carried))
        metrics["async/trainer_wait_s"].append(taken.waited_s)
        return taken

    def _submit(self, batch: list[dict[str, Any]]) -> None:
        trainer = self.trainer
        prompt_ids = compat.tokenize_prompts(trainer, [row["prompt"] for row in batch])
        tasks = [task_from_row(row) for row in batch]
        self._submitted[id(batch)] = batch
        self.engine.submit(
            self._next_order, list(batch), prompt_ids, tasks, trainer.rollout_seeds(len(batch))
        )
        self._next_order += 1

    def correct(
        self, output: dict[str, Any], trajectories: list[Trajectory], metrics: dict
    ) -> None:
        """Importance weights of stale tokens into the token advantages (transformers
        generation; TRL corrects vLLM's samples itself)."""
        if self.trainer.use_vllm:
            return
        step = self.trainer.state.global_step
        width = output["completion_ids"].shape[1]
        stale = stale_token_mask(trajectories, step, width)
        if not stale.any():
            metrics["async/importance_weight_mean"].append(1.0)
            return
        rows = [i for i in range(len(trajectories)) if stale[i].any()]
        model = self.trainer.accelerator.unwrap_model(self.trainer.model_wrapped)
        current = torch.zeros(stale.shape)
        behaviour = torch.zeros(stale.shape)
        scored = token_logprobs(
            model,
            [trajectories[i].prompt_ids for i in rows],
            [trajectories[i].completion_ids for i in rows],
            self.args.temperature,
            compat.tokenizer(self.trainer).pad_token_id,
        )
        for i, values in zip(rows, scored, strict=True):
            current[i, : len(values)] = torch.tensor(values)
            behaviour[i, : len(values)] = torch.tensor(
                [0.0 if lp is None else lp for lp in trajectories[i].logprobs]
            )
        weights = importance_weights(
            current,
            behaviour,
            stale,
            self.args.vllm_importance_sampling_mode,
            self.args.vllm_importance_sampling_clip_min,
            self.args.vllm_importance_sampling_clip_max,
        )
        advantages = output["advantages"]
        output["advantages"] = advantages * weights.to(advantages.device, advantages.dtype)
        metrics["async/importance_weight_mean"].append(weights[stale].mean().item())

    def close(self) -> None:
        self.engine.close()


def stale_token_mask(trajectories: list[Trajectory], step: int, width: int) -> torch.Tensor:
    """``[B, width]``: the model tokens of turns generated by weights older than ``step``."""
    mask = torch.zeros((len(trajectories), width), dtype=torch.bool)
    for i, trajectory in enumerate(trajectories):
        old = {t for t, turn in enumerate(trajectory.turns) if turn.policy_step < step}
        for j, turn in enumerate(trajectory.turn_index[:width]):
            mask[i, j] = turn >= 0 and turn in old
    return mask
