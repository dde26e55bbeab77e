"""KernelGRPOTrainer: TRL's GRPOTrainer with the kernel environment as the reward source.

A subclass, not a fork: vLLM generation (colocate and server), the loss variants, the vLLM
importance-sampling correction, DeepSpeed through accelerate, gradient checkpointing, PEFT and
logging are TRL's. What this class overrides, and why:

- ``rollout_func`` (a TRL hook): multi-turn rollouts through ``kernelrl.rl.rollout`` - the model
  writes a kernel, the environment pool evaluates it, its feedback becomes the next user
  message, up to ``max_turns``; the whole exchange is one completion whose feedback tokens are
  masked out of the loss (TRL's ``env_mask``).
- ``_calculate_rewards``: rewards come from the EvalResults of every turn, through the TRL
  reward functions of ``kernelrl.rewards`` (one per component, so TRL logs each separately).
  TRL receives the last turn's components; the per-turn rewards are kept for the advantages.
  A turn whose EvalResult is a ``harness_error`` (or missing) is unscored: NaN in every
  component, never 0; it gets advantage 0, stays out of every baseline, and its tokens are
  masked out of the loss (``env/harness_error_frac``, ``env/unscored_turn_frac`` count them).
- ``_generate_and_score_completions``: after TRL has scored the batch, its per-sample
  advantages are replaced by turn-level ones (GRPO per turn, or TRLOO), multiplied by the
  profiling-based rejection weights and laid over each turn's tokens; with
  ``overlap_evaluation`` the next batch is generated while this batch's last turn is evaluated.
- weight sync into a colocated vLLM (``kernelrl.rl.weight_sync``), which TRL's cannot do on CPU.
- checkpoints carry what TRL's do not (rollout counter, TRL's buffered generation, a pending
  overlapped batch) so that a resumed run continues exactly.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
from accelerate.utils import gather, gather_object
from trl import GRPOTrainer
from trl.extras.profiling import profiling_context
from trl.trainer.utils import pad

from kernelrl.env.evaluator import EvalConfig
from kernelrl.env.pools import make_pool
from kernelrl.env.result import Status
from kernelrl.rewards import build_reward_funcs
from kernelrl.rl import weight_sync
from kernelrl.rl.advantages import grpo_advantages, trloo_advantages, turn_returns
from kernelrl.rl.config import KernelGRPOConfig
from kernelrl.rl.rejection import rejection_weights
from kernelrl.rl.rollout import (
    MultiTurnRollout,
    RolloutConfig,
    RolloutStats,
    Trajectory,
    task_from_row,
)

STATE_FILE = "kernelrl_state_{rank}.pt"


@dataclass
class RolloutBatch:
    """Trajectories of one generation batch and how long producing them took."""

    key: tuple
    trajectories: list[Trajectory]
    stats: RolloutStats


def batch_key(rows: Sequence[dict[str, Any]]) -> tuple:
    """Content key of a generation batch: the same rows give the same key after a resume."""
    return tuple((str(row.get("id")), str(row.get("prompt"))) for row in rows)


@contextlib.contextmanager
def _override(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


class KernelGRPOTrainer(GRPOTrainer):
    """GRPO/TRLOO on kernel-writing tasks; see the module docstring."""

    _tag_names = ["trl", "grpo", "kernelrl"]

    def __init__(
        self,
        model: Any,
        args: KernelGRPOConfig,
        train_dataset: Any,
        eval_dataset: Any = None,
        processing_class: Any = None,
        pool: Any = None,
        callbacks: list | None = None,
        optimizers: tuple = (None, None),
        peft_config: Any = None,
    ) -> None:
        if not isinstance(args, KernelGRPOConfig):
            raise TypeError("KernelGRPOTrainer needs a KernelGRPOConfig")
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is TRL's hook
        reward_funcs, weights = build_reward_funcs(args.reward_config())
        args.reward_weights = weights
        self._owns_pool = pool is None
        if pool is None:
            pool = make_pool(
                args.env_pool,
                EvalConfig(device=args.env_device, timeout_s=args.env_timeout_s),
                workers=args.env_workers,
                per_gpu=args.env_per_gpu,
                ray_address=args.env_ray_address,
                service_name=args.env_service_name,
                store_path=args.env_store_path,
            )
        self.pool = pool
        self._prepared: RolloutBatch | None = None
        self._current_inputs: list[dict[str, Any]] | None = None
        self._pending: RolloutBatch | None = None
        self._turn_rewards: torch.Tensor | None = None  # [B_local, T, K] of the last scored batch
        self._rollout_counter = 0
        self._ahead: collections.deque = collections.deque()
        self._ahead_iterator: Any = None
        self._sequence: list[Any] = []  # current accumulation window + look-ahead batches
        try:
            with _engine_kwargs(args.vllm_engine_kwargs):
                super().__init__(
                    model=model,
                    reward_funcs=reward_funcs,
                    args=args,
                    train_dataset=train_dataset,
                    eval_dataset=eval_dataset,
                    processing_class=processing_class,
                    callbacks=callbacks,
                    optimizers=optimizers,
                    peft_config=peft_config,
                    rollout_func=self._rollout_func,
                )
        except BaseException:
            self.close()
            raise
        if self.use_vllm:
            weight_sync.install(self.vllm_generation)
        self.rollout = MultiTurnRollout(
            self._tokenizer,
            self.pool,
            RolloutConfig(
                max_turns=args.max_turns,
                max_completion_length=args.max_completion_length,
                stop_when_correct=args.stop_when_correct,
                feedback_template=args.feedback_template,
                max_feedback_tokens=args.max_feedback_tokens,
                max_context_tokens=args.max_context_tokens,
                min_turn_tokens=args.min_turn_tokens,
            ),
            eos_token_ids=self.eos_token_ids,
            chat_template_kwargs=self.chat_template_kwargs,
        )

    def close(self) -> None:
        """Shut the environment pool down when this trainer created it."""
        if self._owns_pool and self.pool is not None:
            self.pool.close()
            self.pool = None

    # ------------------------------------------------------------------ generation
    def _generate_tokens(
        self,
        prompt_ids: list[list[int]],
        max_new_tokens: int,
        seeds: list[int] | None,
        num_generations: int = 1,
    ) -> tuple[list[list[int]], list[list[float | None]] | None]:
        """One turn for every prompt, on vLLM (colocated or server) or transformers."""
        if not self.use_vllm:
            with (
                _override(self.generation_config, "max_new_tokens", max_new_tokens),
                _override_item(self.generation_kwargs, "max_new_tokens", max_new_tokens),
            ):
                completion_ids, _ = self._generate_single_turn(prompt_ids, None, {}, 1)
            return [list(ids) for ids in completion_ids], None
        if self.state.global_step != self._last_loaded_step:
            with profiling_context(self, "sync_weights"):
                self.vllm_generation.sync_weights()
            self._last_loaded_step = self.state.global_step
        generation = self.vllm_generation
        seeded = seeds is not None and self.args.seeded_sampling
        if generation.mode == "colocate" and generation.tensor_parallel_size == 1 and seeded:
            return self._colocated_generate(prompt_ids, max_new_tokens, seeds)
        count = len(prompt_ids)
        if (
            generation.mode == "server"
            and num_generations == 1
            and self.accelerator.num_processes > 1
        ):
            # TRL's server path slices the gathered outputs assuming equal counts per process.
            most = max(gather_object([count]))
            prompt_ids = prompt_ids + [prompt_ids[0] if prompt_ids else [0]] * (most - count)
        with _override(generation, "max_completion_length", max_new_tokens):
            _, completion_ids, logprobs, _ = generation.generate(
                prompts=prompt_ids,
                images=None,
                num_generations=num_generations,
                profiler=profiling_context(self, "vLLM.generate"),
            )
        completion_ids = [list(ids) for ids in completion_ids[:count]]
        if logprobs is None:
            return completion_ids, None
        return completion_ids, [[lp[0] for lp in seq] for seq in logprobs[:count]]

    def _colocated_generate(
        self, prompt_ids: list[list[int]], max_new_tokens: int, seeds: list[int]
    ) -> tuple[list[list[int]], list[list[float | None]] | None]:
        """Colocated vLLM with one seed per request: reproducible sampling across a resume."""
        from trl.generation.vllm_generation import extract_logprobs
        from vllm import SamplingParams

        generation = self.vllm_generation
        if not prompt_ids:
            return [], []
        if generation.enable_sleep_mode and generation._llm_weights_sleeping:
            generation.sync_weights()
        params = {
            "n": 1,
            "repetition_penalty": generation.repetition_penalty,
            "temperature": generation.temperature,
            "top_p": generation.top_p,
            "top_k": generation.top_k,
            "min_p": 0.0 if generation.min_p is None else generation.min_p,
            "max_tokens": max_new_tokens,
            "logprobs": generation.logprobs,
            **generation.generation_kwargs,
        }
        sampling = [SamplingParams(**{**params, "seed": int(seed) % 2**31}) for seed in seeds]
        if generation.enable_sleep_mode:
            generation.llm.wake_up(tags=["kv_cache"])
        with profiling_context(self, "vLLM.generate"):
            outputs = generation.llm.generate(
                [{"prompt_token_ids": ids} for ids in prompt_ids],
                sampling_params=sampling,
                use_tqdm=False,
            )
        if generation.enable_sleep_mode:
            generation.llm.sleep(level=2)
            generation._llm_weights_sleeping = True
        completion_ids = [list(out.outputs[0].token_ids) for out in outputs]
        logprobs, _ = extract_logprobs(outputs)
        if logprobs is None:
            return completion_ids, None
        return completion_ids, [[lp[0] for lp in seq] for seq in logprobs]

    def _start_rollout(self, inputs: list[dict[str, Any]], defer_last: bool) -> RolloutBatch:
        """Generate every turn of a batch; the last turn's evaluation may stay in flight."""
        prompt_ids, _, _ = self._tokenize_prompts([row["prompt"] for row in inputs])
        tasks = [task_from_row(row) for row in inputs]
        seeds = None
        if self.args.seeded_sampling:
            sequence = np.random.SeedSequence(
                [self.args.seed, self._rollout_counter, self.accelerator.process_index]
            )
            seeds = [int(s) for s in sequence.generate_state(len(inputs)) % (2**31 - 64)]
        self._rollout_counter += 1
        mode = "train" if self.model.training else "eval"
        group = self.num_generations if mode == "train" else self.num_generations_eval
        first_turn = None
        if self.use_vllm and self.vllm_generation.mode == "server":
            first_turn = partial(self._generate_tokens, num_generations=group)
        trajectories, stats = self.rollout.run(
            prompt_ids,
            tasks,
            self._generate_tokens,
            defer_last=defer_last,
            seeds=seeds,
            policy_step=self.state.global_step,
            first_turn_generate=first_turn,
        )
        return RolloutBatch(batch_key(inputs), trajectories, stats)

    def _rollout_func(self, prompts: list, trainer: Any) -> dict[str, Any]:
        """TRL's rollout hook: hands TRL the (possibly pre-generated) multi-turn batch."""
        batch = self._prepared
        if batch is None:
            batch = self._start_rollout(self._current_inputs, defer_last=False)
        self._prepared = batch
        trajectories = batch.trajectories
        logprobs = None
        if self.use_vllm and all(t.logprobs for t in trajectories):
            logprobs = [t.logprobs for t in trajectories]
        return {
            "prompt_ids": [t.prompt_ids for t in trajectories],
            "completion_ids": [t.completion_ids for t in trajectories],
            "logprobs": logprobs,
            "env_mask": [t.env_mask for t in trajectories],
            "kernelrl_rollout": trajectories,
        }

    # ------------------------------------------------------------------ look-ahead (overlap)
    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> tuple:
        """With ``overlap_evaluation``, read one generation batch ahead of the trainer so that
        it can be generated while the current batch is evaluated. Only peeks: the trainer
        still consumes every batch in order, so data position and resume are unchanged."""
        if not self.args.overlap_evaluation:
            return super().get_batch_samples(epoch_iterator, num_batches, device)
        if epoch_iterator is not self._ahead_iterator:
            self._ahead_iterator = epoch_iterator
            self._ahead.clear()
        want = num_batches + self.args.steps_per_generation * self.num_iterations
        while len(self._ahead) < want:
            try:
                self._ahead.append(next(epoch_iterator))
            except StopIteration:
                break
        window = [self._ahead.popleft() for _ in range(min(num_batches, len(self._ahead)))]
        self._sequence = window + list(self._ahead)
        return window, None

    def _next_generation_inputs(self, inputs: Any) -> Any:
        generate_every = self.args.steps_per_generation * self.num_iterations
        position = next((i for i, b in enumerate(self._sequence) if b is inputs), None)
        if position is None or position + generate_every >= len(self._sequence):
            return None
        steps_ahead = -(-generate_every // self.args.gradient_accumulation_steps)
        if self.state.global_step + steps_ahead >= self.state.max_steps:
            return None  # nobody would train on it
        return self._sequence[position + generate_every]

    # ------------------------------------------------------------------ scoring
    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        mode = "train" if self.model.training else "eval"
        started = time.perf_counter()
        prepared = None
        if mode == "train" and self.args.overlap_evaluation:
            key = batch_key(inputs)
            if self._pending is not None and self._pending.key == key:
                prepared, self._pending = self._pending, None
            else:
                prepared = self._start_rollout(inputs, defer_last=True)
            upcoming = self._next_generation_inputs(inputs)
            if upcoming is not None:
                # Generated now, with the current weights, while `prepared` is still evaluated.
                self._pending = self._start_rollout(upcoming, defer_last=True)
        self._prepared, self._current_inputs = prepared, inputs
        try:
            output = super()._generate_and_score_completions(inputs)
            batch = self._prepared
        finally:
            self._prepared, self._current_inputs = None, None
        self._apply_advantages(output, batch, mode)
        self._metrics[mode]["timing/rollout_and_score_s"].append(time.perf_counter() - started)
        return output

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        """Per-turn, per-component rewards from the EvalResults; TRL gets the last turn's."""
        device = self.accelerator.device
        mode = "train" if self.model.training else "eval"
        trajectories: list[Trajectory] = [row["kernelrl_rollout"] for row in inputs]
        waited = time.perf_counter()
        for trajectory in trajectories:
            trajectory.results()
        self._metrics[mode]["timing/reward_wait_s"].append(time.perf_counter() - waited)

        turns = self.args.max_turns
        per_turn = torch.full((len(inputs), turns, len(self.reward_funcs)), float("nan"))
        skip = {"prompt", "completion", "completion_ids", "kernelrl_rollout"}
        columns = [key for key in inputs[0] if key not in skip]
        conversational = isinstance(prompts[0], list)
        for t in range(turns):
            rows = [i for i, traj in enumerate(trajectories) if t < len(traj.turns)]
            if not rows:
                continue
            texts = [trajectories[i].turns[t].text for i in rows]
            kwargs = {key: [inputs[i][key] for i in rows] for key in columns}
            kwargs.update(
                eval_results=[trajectories[i].turns[t].result for i in rows],
                trainer_state=self.state,
                log_metric=self._log_metric,
                turn=t,
            )
            turn_completions = (
                [[{"role": "assistant", "content": x}] for x in texts] if conversational else texts
            )
            turn_prompts = [prompts[i] for i in rows]
            ids = [trajectories[i].turns[t].completion_ids for i in rows]
            for k, (func, name) in enumerate(
                zip(self.reward_funcs, self.reward_func_names, strict=True)
            ):
                if isinstance(func, torch.nn.Module):
                    raise TypeError(
                        "reward models are not supported: rewards come from the environment"
                    )
                with profiling_context(self, name):
                    call = func(
                        prompts=turn_prompts,
                        completions=turn_completions,
                        completion_ids=ids,
                        **kwargs,
                    )
                    if asyncio.iscoroutine(call):
                        call = asyncio.run_coroutine_threadsafe(call, self.async_loop).result()
                values = [float("nan") if v is None else float(v) for v in call]
                if len(values) != len(rows):
                    raise ValueError(
                        f"reward function {name} returned {len(values)} values for {len(rows)}"
                    )
                per_turn[rows, t, k] = torch.tensor(values)
        for i, trajectory in enumerate(trajectories):  # whatever a reward function said
            for t, turn in enumerate(trajectory.turns):
                if not turn.scored:  # harness_error or no result: no reward, not 0
                    per_turn[i, t] = float("nan")
        self._turn_rewards = per_turn
        last = torch.stack(
            [per_turn[i, max(len(traj.turns) - 1, 0)] for i, traj in enumerate(trajectories)]
        )
        return gather(last.to(device))

    def _apply_advantages(
        self, output: dict[str, Any], batch: RolloutBatch | None, mode: str
    ) -> None:
        """Replace TRL's per-sample advantages by turn-level ones laid over the tokens."""
        args = self.args
        device = self.accelerator.device
        trajectories = batch.trajectories
        local = self._turn_rewards  # [B, T, K]
        turns = local.shape[1]
        weights = self.reward_weights.to(local.device)
        valid_local = ~torch.isnan(local).all(dim=-1)
        rewards_local = torch.where(valid_local, (local * weights).nansum(-1), torch.zeros(()))
        keep_local = torch.ones_like(rewards_local)
        stats_total: collections.Counter = collections.Counter()
        if args.rejection_sampling:
            config = args.rejection_config()
            for i, trajectory in enumerate(trajectories):
                for t, turn in enumerate(trajectory.turns):
                    if turn.result is not None:
                        w, stats = rejection_weights([turn.result], config)
                        keep_local[i, t] = w[0]
                        stats_total.update({k: v for k, v in stats.items() if k != "rate"})
        rewards = gather(rewards_local.to(device)).cpu()
        valid = gather(valid_local.to(device)).cpu().bool()
        keep = gather(keep_local.to(device)).cpu()
        group = self.num_generations if mode == "train" else self.num_generations_eval
        grid = (-1, group, turns)
        usable = valid & (keep > 0)
        returns = turn_returns(
            rewards.view(grid), usable.view(grid), args.turn_return, args.turn_gamma
        )
        if args.advantage == "trloo":
            advantages = trloo_advantages(returns, usable.view(grid)).view(-1, turns)
        else:
            scale = args.scale_rewards != "none"
            flat = returns.view(-1, turns)
            advantages = torch.stack(
                [
                    grpo_advantages(
                        torch.where(usable[:, t], flat[:, t], torch.nan), group, scale=scale
                    )
                    for t in range(turns)
                ],
                dim=1,
            )
        advantages = advantages * keep  # down-weighting (dropped samples are 0 already)
        start = self.accelerator.process_index * len(trajectories)
        advantages_local = advantages[start : start + len(trajectories)]

        turn_map = pad(
            [torch.tensor(t.turn_index, dtype=torch.long) for t in trajectories],
            padding_value=-1,
            padding_side="right",
            pad_to_multiple_of=self.pad_to_multiple_of,
        )
        width = output["completion_ids"].shape[1]
        turn_map = torch.nn.functional.pad(turn_map, (0, width - turn_map.shape[1]), value=-1)
        token_advantages = advantages_local.gather(1, turn_map.clamp(min=0)) * (turn_map >= 0)
        output["advantages"] = token_advantages.to(device=device, dtype=torch.float32)
        # Tokens of unscored turns (reached, no reward: harness_error) leave the loss entirely.
        reached = torch.tensor([[t < len(tr.turns) for t in range(turns)] for tr in trajectories])
        unscored = (reached & ~valid_local.cpu()).gather(1, turn_map.clamp(min=0)) & (turn_map >= 0)
        if unscored.any() and "tool_mask" in output:
            keep_tokens = (~unscored).to(device=device, dtype=output["tool_mask"].dtype)
            output["tool_mask"] = output["tool_mask"] * keep_tokens
        self._log_rollout_metrics(
            mode, trajectories, batch, rewards, valid, keep, advantages, stats_total
        )

    def _log_rollout_metrics(
        self,
        mode: str,
        trajectories: list[Trajectory],
        batch: RolloutBatch,
        rewards: torch.Tensor,
        valid: torch.Tensor,
        keep: torch.Tensor,
        advantages: torch.Tensor,
        rejection: collections.Counter,
    ) -> None:
        metrics = self._metrics[mode]
        for t in range(rewards.shape[1]):
            reached = valid[:, t]
            if reached.any():
                metrics[f"turns/reward_turn{t}"].append(rewards[reached, t].mean().item())
        metrics["turns/mean"].append(float(np.mean([len(t.turns) for t in trajectories])))
        reasons = collections.Counter(t.stop_reason for t in trajectories)
        for reason in ("correct", "max_turns", "context", "env_error"):
            metrics[f"turns/stop_{reason}"].append(reasons[reason] / len(trajectories))
        statuses: collections.Counter = collections.Counter()
        finals: list[bool] = []
        for trajectory in trajectories:
            results = trajectory.results()
            statuses.update(str(r.status) for r in results if r is not None)
            finals.append(bool(results and results[-1] is not None and results[-1].correct))
        evaluated = max(sum(statuses.values()), 1)
        for status in Status:
            metrics[f"env/{status}"].append(statuses[status] / evaluated)
        # Unscored turns: our harness failed (after the pool's retry) or no result came back.
        generated = max(sum(len(t.turns) for t in trajectories), 1)
        unscored = sum(not turn.scored for t in trajectories for turn in t.turns)
        metrics["env/harness_error_frac"].append(statuses[Status.HARNESS_ERROR] / evaluated)
        metrics["env/unscored_turn_frac"].append(unscored / generated)
        metrics["env/correct_final"].append(float(np.mean(finals)))
        metrics["rejection/rate"].append(
            ((keep < 1) & valid).sum().item() / max(valid.sum().item(), 1)
        )
        for key in ("integrity", "low_kernel_share", "share_unknown"):
            metrics[f"rejection/{key}"].append(float(rejection.get(key, 0)))
        metrics["rollout/staleness"].append(
            float(np.mean([self.state.global_step - t.policy_step for t in trajectories]))
        )
        metrics["timing/generation_s"].append(batch.stats.generation_s)
        metrics["timing/turn_eval_wait_s"].append(batch.stats.evaluation_wait_s)
        metrics["advantage/abs_mean"].append(
            advantages[valid].abs().mean().item() if valid.any() else 0.0
        )

    # ------------------------------------------------------------------ checkpoints
    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        folder = os.path.join(
            self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}"
        )
        pending = None
        if self._pending is not None:
            pending = {
                "key": self._pending.key,
                "trajectories": [t.to_record() for t in self._pending.trajectories],
                "stats": vars(self._pending.stats),
            }
        state = {
            "rollout_counter": self._rollout_counter,
            "step": self._step,
            "buffered_inputs": self._buffered_inputs,
            "pending": pending,
        }
        os.makedirs(folder, exist_ok=True)
        torch.save(
            state, os.path.join(folder, STATE_FILE.format(rank=self.accelerator.process_index))
        )

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        path = os.path.join(checkpoint, STATE_FILE.format(rank=self.accelerator.process_index))
        if not os.path.exists(path):
            return
        state = torch.load(path, weights_only=False)
        self._rollout_counter = state["rollout_counter"]
        self._step = state["step"]
        self._buffered_inputs = state["buffered_inputs"]
        pending = state["pending"]
        if pending is not None:
            self._pending = RolloutBatch(
                key=pending["key"],
                trajectories=[Trajectory.from_record(r) for r in pending["trajectories"]],
                stats=RolloutStats(**pending["stats"]),
            )


@contextlib.contextmanager
def _engine_kwargs(extra: dict | None) -> Iterator[None]:
    """Add keyword arguments to the vLLM engine TRL builds in colocate mode (TRL 1.16 does not
    forward e.g. ``enforce_eager``, which vLLM's CPU backend needs to start in seconds)."""
    if not extra:
        yield
        return
    import trl.generation.vllm_generation as generation_module

    original = generation_module.LLM
    generation_module.LLM = partial(original, **extra)
    try:
        yield
    finally:
        generation_module.LLM = original


@contextlib.contextmanager
def _override_item(mapping: dict, key: str, value: Any) -> Iterator[None]:
    missing = object()
    old = mapping.get(key, missing)
    mapping[key] = value
    try:
        yield
    finally:
        if old is missing:
            mapping.pop(key, None)
        else:
            mapping[key] = old
