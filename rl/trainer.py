"""KernelGRPOTrainer: TRL's GRPOTrainer with the kernel environment as the reward source.

A subclass, not a fork, and a thin shell: vLLM generation (colocate and server), the loss
variants, the vLLM importance-sampling correction, DeepSpeed through accelerate, gradient
checkpointing, PEFT and logging are TRL's; what kernelrl computes on a batch is the sequence of
plain functions in ``kernelrl.rl.steps`` (rollout -> rewards per turn -> rejection ->
advantages per turn -> over the tokens -> TRL's batch), which this class calls from TRL's hooks.
Every TRL / transformers / vLLM private it touches goes through ``kernelrl.rl.compat`` (TRL's
private hooks are overridden there, in ``compat.GRPOHooks``, and forwarded to the named methods
below).

One generation batch, in the order TRL calls the hooks (``score_batch`` wraps TRL's
``_generate_and_score_completions``; the batch being scored is one ``BatchInFlight`` record):

1. ``_rollout_func`` (TRL's ``rollout_func``): multi-turn rollouts through
   ``kernelrl.rl.rollout`` - the model writes a kernel, the environment pool evaluates it, its
   feedback becomes the next user message, up to ``max_turns``; the whole exchange is one
   completion whose feedback tokens are masked out of the loss (TRL's ``env_mask``). With
   ``overlap_evaluation`` the batch was generated ahead, while the previous one was evaluated.
2. ``rewards_for_trl`` (TRL's ``_calculate_rewards``): ``steps.score_turns`` and
   ``steps.reject_turns`` - rewards of every turn from its EvalResult through the TRL reward
   functions of ``kernelrl.rewards`` (one per component, so TRL logs each), and the rejection
   weights. TRL receives the last turn's components (its reward metrics are replaced in 3).
3. ``_apply_advantages`` (after TRL has scored the batch): ``steps.turn_advantages`` over every
   process's turns (GRPO per turn, TRLOO or Dr. Kernel's TRLOO, times the rejection weights),
   ``steps.token_advantages`` over this process's tokens, ``steps.into_trl_batch`` replaces
   TRL's advantages and takes unscored and left-out turns out of TRL's ``tool_mask``; the logged
   reward metrics describe every trained turn (``kernelrl.rl.metrics``).

Also: weight sync into a colocated vLLM (``kernelrl.rl.weight_sync``), which TRL's cannot do on
CPU; checkpoints carry what TRL's do not (rollout counter, TRL's buffered generation, a pending
overlapped batch) so that a resumed run continues exactly.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate.utils import gather, gather_object
from trl import GRPOTrainer
from trl.extras.profiling import profiling_context

from kernelrl.env.pools import Pool
from kernelrl.env.task import task_from_row
from kernelrl.rewards import build_reward_funcs
from kernelrl.rl import compat, steps, weight_sync
from kernelrl.rl.async_trainer import AsyncTraining
from kernelrl.rl.config import KernelGRPOConfig
from kernelrl.rl.engines import engine_kwargs, server_client_class
from kernelrl.rl.grad_guard import NonFiniteGradientGuard
from kernelrl.rl.metrics import rollout_metrics, trained_reward_metrics
from kernelrl.rl.rollout import (
    MultiTurnRollout,
    RolloutConfig,
    RolloutStats,
    Trajectory,
)
from kernelrl.rl.rollout_log import append_records, rollout_records
from kernelrl.rl.steps import RolloutBatch, batch_key

log = logging.getLogger(__name__)

STATE_FILE = "kernelrl_state_{rank}.pt"


def own_pool(args: KernelGRPOConfig) -> Pool:
    """The pool a trainer builds when it is given none, where the recipe's topology allows it."""
    args.check_overlap()
    if args.async_generation and args.environment.env_pool == "local":
        log.warning(
            "async_generation with env_pool: local: the pool's slots share this process's "
            "interpreter lock with generation (measured twice as slow); env_pool: process runs "
            "them in a process of their own"
        )
    return args.environment.make_pool(gpus=args.environment_gpus())


@dataclass
class BatchInFlight:
    """The generation batch TRL is scoring, filled in by TRL's hooks in the order TRL calls
    them (see the module docstring)."""

    inputs: list[dict[str, Any]]
    rollout: RolloutBatch | None = None  # generated ahead (overlap), or by _rollout_func
    turns: steps.RewardedTurns | None = None  # this process's, from rewards_for_trl


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
        reward_funcs, weights = build_reward_funcs(args.reward)
        args.reward_weights = weights
        self._owns_pool = pool is None
        if pool is None:
            pool = own_pool(args)
        self.pool = pool
        self._in_flight: BatchInFlight | None = None  # the batch TRL is scoring
        self._pending: RolloutBatch | None = None  # generated ahead (overlap_evaluation)
        self._rollout_counter = 0
        self._ahead: collections.deque = collections.deque()
        self._ahead_iterator: Any = None
        self._across_epochs = False  # look_ahead reads from iterators of its own (_next_epoch)
        self._sequence: list[Any] = []  # current accumulation window + look-ahead batches
        try:
            with (
                compat.engine_kwargs(engine_kwargs(args, model)),
                compat.server_client(server_client_class(args)),
            ):
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
        if not self.is_deepspeed_enabled:  # DeepSpeed's engine steps inside backward
            # logged into this step's metrics (TRL's log_metric would land in the next step's)
            train_metrics = compat.metrics(self, "train")
            self.add_callback(
                NonFiniteGradientGuard(
                    args.max_nonfinite_grad_steps,
                    lambda name, value: train_metrics[name].append(value),
                )
            )
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
        self.asynchronous = AsyncTraining(self) if args.async_generation else None

    def close(self) -> None:
        """Stop asynchronous generation; shut the environment pool down when this trainer
        created it."""
        if getattr(self, "asynchronous", None) is not None:
            self.asynchronous.close()
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
        seeds = self.rollout_seeds(len(inputs))
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

    def rollout_seeds(self, count: int) -> list[int] | None:
        """One base seed per sample of the next generation batch (``seeded_sampling``), from the
        run's seed, the rollout counter and the process: the same batch samples the same
        tokens after a resume and in either mode."""
        seeds = None
        if self.args.seeded_sampling:
            sequence = np.random.SeedSequence(
                [self.args.seed, self._rollout_counter, self.accelerator.process_index]
            )
            seeds = [int(s) for s in sequence.generate_state(count) % (2**31 - 64)]
        self._rollout_counter += 1
        return seeds

    def _rollout_func(self, prompts: list, trainer: Any) -> dict[str, Any]:
        """TRL's rollout hook: hands TRL the (possibly pre-generated) multi-turn batch."""
        flight = self._in_flight
        if flight.rollout is None:
            flight.rollout = self._start_rollout(flight.inputs, defer_last=False)
        batch = flight.rollout
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
        ahead = self.asynchronous.batches_ahead() if self.asynchronous else 1
        if not (self.args.overlap_evaluation or self.asynchronous):
            return trl_get(epoch_iterator, num_batches, device)
        if epoch_iterator is not self._ahead_iterator and not self._across_epochs:
            self._ahead_iterator = epoch_iterator
            self._ahead.clear()
        want = num_batches + self.args.steps_per_generation * self.num_iterations * ahead
        fresh = False  # an epoch that yields nothing ends the look-ahead
        while len(self._ahead) < want:
            try:
                self._ahead.append(next(self._ahead_iterator))
                fresh = False
            except StopIteration:
                if fresh or not self._next_epoch():
                    break
                fresh = True
        window = [self._ahead.popleft() for _ in range(min(num_batches, len(self._ahead)))]
        self._sequence = window + list(self._ahead)
        return window, None

    def _next_epoch(self) -> bool:
        """Asynchronous training reads ahead across an epoch's end: the next epoch's iterator
        over the same prepared loader (``iter`` of a loader draws nothing until its first batch,
        and its sampler draws each epoch's order once, so the order is the synchronous run's);
        transformers' own iterator of that epoch is then never advanced. Without this, the first
        step of every epoch would wait for its whole generation."""
        loader = getattr(self.callback_handler, "train_dataloader", None)
        if self.asynchronous is None or loader is None:
            return False
        self._ahead_iterator, self._across_epochs = iter(loader), True
        return True

    def upcoming_inputs(self, inputs: Any, count: int) -> list[Any]:
        """The next ``count`` generation batches after ``inputs`` that a step will train on."""
        generate_every = self.args.steps_per_generation * self.num_iterations
        position = next((i for i, b in enumerate(self._sequence) if b is inputs), None)
        found = []
        for ahead in range(1, count + 1) if position is not None else ():
            if position + ahead * generate_every >= len(self._sequence):
                break
            steps_ahead = -(-ahead * generate_every // self.args.gradient_accumulation_steps)
            if self.state.global_step + steps_ahead >= self.state.max_steps:
                break  # nobody would train on it
            found.append(self._sequence[position + ahead * generate_every])
        return found

    # ------------------------------------------------------------------ scoring
    def score_batch(self, inputs: list[dict[str, Any]], trl_score: Any) -> dict[str, Any]:
        """TRL's ``_generate_and_score_completions`` (``trl_score``) around kernelrl's rollout:
        the batch may have been generated ahead (overlap); TRL's advantages are replaced."""
        mode = "train" if self.model.training else "eval"
        started = time.perf_counter()
        flight = BatchInFlight(inputs)
        if mode == "train" and self.args.overlap_evaluation:
            key = batch_key(inputs)
            if self._pending is not None and self._pending.key == key:
                flight.rollout, self._pending = self._pending, None
            else:
                flight.rollout = self._start_rollout(inputs, defer_last=True)
            for upcoming in self.upcoming_inputs(inputs, 1):
                # Generated now, with the current weights, while this batch is still evaluated.
                self._pending = self._start_rollout(upcoming, defer_last=True)
        elif mode == "train" and self.asynchronous is not None:
            # Rows of the groups this step trains: complete ones, possibly of earlier batches.
            taken = self.asynchronous.step(inputs)
            flight.rollout, inputs = taken.batch, taken.rows
            flight.inputs = inputs
        self._in_flight = flight
        paused = self.asynchronous.paused() if self.asynchronous and mode == "eval" else None
        try:
            with paused or contextlib.nullcontext():  # evaluation generates on this thread
                output = trl_score(inputs)
        finally:
            self._in_flight = None
        self._apply_advantages(output, flight, mode)
        compat.metrics(self, mode)["timing/rollout_and_score_s"].append(
            time.perf_counter() - started
        )
        return output

    def rewards_for_trl(self, inputs: list[dict[str, Any]], prompts: list) -> torch.Tensor:
        """TRL's ``_calculate_rewards``: steps 1-2, rewards of every turn and component and the
        rejection weights (kept for the advantages); TRL gets each sample's last turn."""
        mode = "train" if self.model.training else "eval"
        trajectories: list[Trajectory] = [row["kernelrl_rollout"] for row in inputs]
        waited = time.perf_counter()
        for trajectory in trajectories:
            trajectory.results()
        compat.metrics(self, mode)["timing/reward_wait_s"].append(time.perf_counter() - waited)
        components = steps.score_turns(
            trajectories,
            inputs,
            prompts,
            self.reward_func_names,
            self._call_reward,
            self.args.max_turns,
            extra={"trainer_state": self.state, "log_metric": compat.log_metric_fn(self)},
        )
        reject = None
        rejection = self.args.rejection
        if rejection.rejection_sampling:
            reject = steps.make_rejector(
                rejection.rejection_preset,
                rejection.config(),
                rejection.drkernel_config(),
                seed=(self.args.seed, self.state.global_step, self.accelerator.process_index),
            )
        self._in_flight.turns = steps.rewarded_turns(
            components, self.reward_weights, trajectories, reject
        )
        return gather(steps.last_turn(components, trajectories).to(self.accelerator.device))

    def _call_reward(self, k: int, kwargs: dict[str, Any]) -> list[float | None]:
        """Reward function ``k`` on one turn's rows, profiled under its name as TRL does."""
        func, name = self.reward_funcs[k], self.reward_func_names[k]
        if isinstance(func, torch.nn.Module):
            raise TypeError("reward models are not supported: rewards come from the environment")
        with profiling_context(self, name):
            values = func(**kwargs)
            if asyncio.iscoroutine(values):
                values = asyncio.run_coroutine_threadsafe(values, self.async_loop).result()
        return list(values)

    def _apply_advantages(self, output: dict[str, Any], flight: BatchInFlight, mode: str) -> None:
        """Steps 3-5: advantages of every process's turns, laid over this process's tokens in
        TRL's batch; TRL's reward metrics replaced by ones over every trained turn."""
        device = self.accelerator.device
        local = flight.turns
        trajectories = flight.rollout.trajectories
        turns = local.across(lambda x: gather(x.to(device)).cpu())
        group = self.num_generations if mode == "train" else self.num_generations_eval
        advantages = steps.turn_advantages(turns, group, steps.AdvantageSettings.of(self.args))
        mine = advantages.rows(
            self.accelerator.process_index * len(trajectories), len(trajectories)
        )
        left_out = steps.left_out_turns(
            local, mine, drop_rejected=self.args.rejection.rejection_preset == "drkernel"
        )
        tokens = steps.token_advantages(
            mine.advantages, left_out, trajectories, output["completion_ids"].shape[1]
        )
        steps.into_trl_batch(output, tokens, device)
        metrics = compat.metrics(self, mode)
        if mode == "train" and self.asynchronous is not None:
            self.asynchronous.correct(output, trajectories, metrics)
        for key, value in trained_reward_metrics(
            turns.components, turns.weights.cpu(), turns.trained, group, self.reward_func_names
        ).items():
            metrics[key][-1:] = [value]  # TRL's entry of this batch described the last turn
        for key, value in rollout_metrics(
            flight.rollout, local, turns, advantages, self.state.global_step
        ).items():
            metrics[key].append(value)
        if mode == "train" and self.args.save_rollouts:
            rank = self.accelerator.process_index
            records = rollout_records(
                trajectories, local.rewards, mine.advantages, self.state.global_step
            )
            append_records(Path(self.args.output_dir) / "rollouts" / f"rank{rank}.jsonl", records)

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
