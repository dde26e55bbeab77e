"""One generation batch from rollouts to the tensors TRL's loss consumes, as plain functions.

The trainer (``kernelrl.rl.trainer``) is a shell over TRL that calls these in this order:

    list[Trajectory]                    every turn's completion and EvalResult (rl/rollout.py)
      -> score_turns                    reward of every turn and component (kernelrl.rewards'
                                        TRL functions, called per turn)
      -> reject_turns                   keep weight of every turn (kernelrl.rl.rejection)
      = RewardedTurns                   per process; the trainer gathers it across processes
      -> turn_advantages                advantage of every turn (kernelrl.rl.advantages)
      = TurnAdvantages
      -> token_advantages               laid over each turn's tokens, with the tokens that
                                        leave the loss
      = TokenAdvantages
      -> into_trl_batch                 TRL's ``advantages`` and ``tool_mask`` of the batch

The scalar trained on is ``RewardedTurns.rewards`` (``kernelrl.rewards.weighted_total`` of the
components of a turn, the one definition of the reward), turned into an advantage per turn and multiplied by the turn's keep weight; nothing
else re-weights it. No trainer state and no process group here, so every step is tested on
hand-built tensors.

Unscored turns (EvalResult ``harness_error`` or none: kernelrl failed, not the solution) have
NaN in every component, whatever a reward function said; they get advantage 0, stay out of
every baseline and their tokens leave the loss.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import Tensor

from kernelrl.env.result import EvalResult
from kernelrl.rewards import weighted_total
from kernelrl.rl.advantages import (
    drkernel_trloo_advantages,
    grpo_advantages,
    trloo_advantages,
    turn_returns,
)
from kernelrl.rl.rejection import (
    DrKernelRejectionConfig,
    RejectionConfig,
    drkernel_rejection_weights,
    rejection_weights,
)
from kernelrl.rl.rollout import RolloutStats, Trajectory

#: ``call(k, kwargs)``: reward function ``k`` on one turn's rows (TRL's keyword arguments);
#: one value per row, None for "no reward".
RewardCall = Callable[[int, dict[str, Any]], Sequence[float | None]]
#: ``reject(results)``: keep weights and stats of EvalResults (``kernelrl.rl.rejection``).
Rejector = Callable[[list[EvalResult]], tuple[Tensor, dict[str, float]]]

#: Dataset columns that are not handed to reward functions as keyword arguments.
NOT_REWARD_KWARGS = frozenset({"prompt", "completion", "completion_ids", "kernelrl_rollout"})


@dataclass
class RolloutBatch:
    """Trajectories of one generation batch and how long producing them took."""

    key: tuple
    trajectories: list[Trajectory]
    stats: RolloutStats


def batch_key(rows: Sequence[Mapping[str, Any]]) -> tuple:
    """Content key of a generation batch: the same rows give the same key after a resume."""
    return tuple((str(row.get("id")), str(row.get("prompt"))) for row in rows)


# ---------------------------------------------------------------------- 1. rewards per turn
def score_turns(
    trajectories: Sequence[Trajectory],
    rows: Sequence[Mapping[str, Any]],
    prompts: Sequence[Any],
    names: Sequence[str],
    call: RewardCall,
    max_turns: int,
    extra: Mapping[str, Any] | None = None,
) -> Tensor:
    """``[B, max_turns, K]`` unweighted reward components of every turn (K = ``len(names)``).

    Each reward function sees one turn of the rows that reached it, in TRL's form: the turn's
    text as the completion (a chat message when the prompts are chats), its ``completion_ids``,
    ``eval_results``, ``turn`` and the dataset columns, plus ``extra``. NaN where a turn was not
    reached or gets no reward (``Turn.rewarded``).
    """
    per_turn = torch.full((len(trajectories), max_turns, len(names)), float("nan"))
    columns = [key for key in rows[0] if key not in NOT_REWARD_KWARGS] if rows else []
    conversational = bool(prompts) and isinstance(prompts[0], list)
    for t in range(max_turns):
        reached = [i for i, traj in enumerate(trajectories) if t < len(traj.turns)]
        if not reached:
            continue
        texts = [trajectories[i].turns[t].text for i in reached]
        kwargs: dict[str, Any] = {key: [rows[i][key] for i in reached] for key in columns}
        kwargs.update(extra or {})
        kwargs.update(
            prompts=[prompts[i] for i in reached],
            completions=(
                [[{"role": "assistant", "content": x}] for x in texts] if conversational else texts
            ),
            completion_ids=[trajectories[i].turns[t].completion_ids for i in reached],
            eval_results=[trajectories[i].turns[t].result for i in reached],
            turn=t,
        )
        for k, name in enumerate(names):
            values = [float("nan") if v is None else float(v) for v in call(k, kwargs)]
            if len(values) != len(reached):
                raise ValueError(
                    f"reward function {name} returned {len(values)} values for {len(reached)}"
                )
            per_turn[reached, t, k] = torch.tensor(values)
    for i, trajectory in enumerate(trajectories):  # whatever a reward function said
        for t, turn in enumerate(trajectory.turns):
            if not turn.rewarded:  # harness_error, no result, speed unjudged: no reward, not 0
                per_turn[i, t] = float("nan")
    return per_turn


def last_turn(per_turn: Tensor, trajectories: Sequence[Trajectory]) -> Tensor:
    """``[B, K]``: each sample's last turn (what TRL's own reward bookkeeping receives)."""
    return torch.stack(
        [per_turn[i, max(len(traj.turns) - 1, 0)] for i, traj in enumerate(trajectories)]
    )


# ---------------------------------------------------------------------- 2. rejection
def make_rejector(
    preset: str,
    config: RejectionConfig,
    drkernel: DrKernelRejectionConfig,
    seed: Sequence[int],
) -> Rejector:
    """The rejection of ``preset``. ``drkernel`` draws (Dr. Kernel's PRS) come from a generator
    seeded by ``seed`` (the run's seed, optimizer step and process: a resumed run draws the
    same)."""
    if preset == "drkernel":
        generator = torch.Generator().manual_seed(
            int(np.random.SeedSequence(list(seed)).generate_state(1)[0])
        )
        return partial(drkernel_rejection_weights, config=drkernel, generator=generator)
    return partial(rejection_weights, config=config)


def reject_turns(
    trajectories: Sequence[Trajectory], max_turns: int, reject: Rejector | None
) -> tuple[Tensor, collections.Counter]:
    """``keep[B, max_turns]`` (1 kept, 0 dropped, in between down-weighted; 1 without
    ``reject``) and the rejection counts (``kernelrl.rl.rejection``'s stats, less the rate).
    Turns are judged one by one, sample after sample, so that random draws have a fixed order."""
    keep = torch.ones(len(trajectories), max_turns)
    counts: collections.Counter = collections.Counter()
    if reject is None:
        return keep, counts
    for i, trajectory in enumerate(trajectories):
        for t, turn in enumerate(trajectory.turns):
            result = turn.resolve()
            if result is not None:
                weights, stats = reject([result])
                keep[i, t] = weights[0]
                counts.update({k: v for k, v in stats.items() if k != "rate"})
    return keep, counts


@dataclass
class RewardedTurns:
    """The rewards of a batch's turns: ``B`` samples (one process's, or all after a gather),
    ``T`` turns, ``K`` reward components."""

    components: Tensor  # [B, T, K] unweighted; NaN where unscored or not reached
    weights: Tensor  # [K] reward weights
    reached: Tensor  # [B, T] bool: the sample generated that turn
    keep: Tensor  # [B, T] rejection weight
    rejection: collections.Counter = field(default_factory=collections.Counter)

    @property
    def valid(self) -> Tensor:
        """``[B, T]``: scored turns (a reward is known)."""
        return ~torch.isnan(self.components).all(dim=-1)

    @property
    def rewards(self) -> Tensor:
        """``[B, T]``: the weighted reward of every scored turn, 0 elsewhere."""
        total = weighted_total(self.components, self.weights.to(self.components.device))
        return torch.where(self.valid, total, torch.zeros(()))

    @property
    def trained(self) -> Tensor:
        """``[B, T]``: turns that enter the loss and the baselines (scored, not dropped)."""
        return self.valid & (self.keep > 0)

    def across(self, gather: Callable[[Tensor], Tensor]) -> RewardedTurns:
        """The same record with every per-sample tensor passed through ``gather`` (e.g. all
        processes' samples, in process order)."""
        return replace(
            self,
            components=gather(self.components),
            reached=gather(self.reached).bool(),
            keep=gather(self.keep),
        )


def rewarded_turns(
    components: Tensor,
    weights: Tensor,
    trajectories: Sequence[Trajectory],
    reject: Rejector | None,
) -> RewardedTurns:
    """Step 1 and 2 together: the components from ``score_turns`` with the keep weights."""
    turns = components.shape[1]
    keep, counts = reject_turns(trajectories, turns, reject)
    reached = torch.tensor(
        [[t < len(tr.turns) for t in range(turns)] for tr in trajectories], dtype=torch.bool
    ).view(len(trajectories), turns)
    return RewardedTurns(components, weights, reached, keep, counts)


# ---------------------------------------------------------------------- 3. advantages per turn
@dataclass(frozen=True)
class AdvantageSettings:
    """How turn rewards become advantages (``KernelGRPOConfig``'s algorithm keys)."""

    estimator: str = "trloo"  # grpo | trloo | drkernel_trloo
    turn_return: str = "own"  # own | discounted (grpo, trloo)
    gamma: float = 1.0
    scale: bool = False  # grpo: divide by the group's std

    @classmethod
    def of(cls, args: Any) -> AdvantageSettings:
        return cls(args.advantage, args.turn_return, args.turn_gamma, args.scale_rewards != "none")


@dataclass
class TurnAdvantages:
    """``advantages[N, T]``, already multiplied by the keep weights; ``excluded[N, T]``: reached
    turns that the estimator left out (Dr. Kernel: a return that sums an unknown reward)."""

    advantages: Tensor
    excluded: Tensor

    def rows(self, start: int, count: int) -> TurnAdvantages:
        """The samples ``start .. start + count`` (this process's, after a gather)."""
        end = start + count
        return TurnAdvantages(self.advantages[start:end], self.excluded[start:end])


def turn_advantages(
    turns: RewardedTurns, group: int, settings: AdvantageSettings
) -> TurnAdvantages:
    """Advantages of every turn, samples in groups of ``group`` consecutive rows (TRL's order)."""
    steps = turns.components.shape[1]
    grid = (-1, group, steps)
    rewards, valid, usable = turns.rewards, turns.valid, turns.trained
    excluded = torch.zeros_like(turns.reached)
    if settings.estimator == "drkernel_trloo":
        # Rejected turns stay in the baselines (Dr. Kernel); `keep` below zeroes their own.
        advantages, included = drkernel_trloo_advantages(
            rewards.view(grid), turns.reached.view(grid), valid.view(grid), settings.gamma
        )
        advantages = advantages.view(-1, steps)
        excluded = turns.reached & ~included.view(-1, steps)
    else:
        returns = turn_returns(
            rewards.view(grid), usable.view(grid), settings.turn_return, settings.gamma
        )
        if settings.estimator == "trloo":
            advantages = trloo_advantages(returns, usable.view(grid)).view(-1, steps)
        elif settings.estimator == "grpo":
            flat = returns.view(-1, steps)
            advantages = torch.stack(
                [
                    grpo_advantages(
                        torch.where(usable[:, t], flat[:, t], torch.nan),
                        group,
                        scale=settings.scale,
                    )
                    for t in range(steps)
                ],
                dim=1,
            )
        else:
            raise ValueError(f"unknown advantage estimator {settings.estimator!r}")
    # down-weighting (dropped samples are 0 already)
    return TurnAdvantages(advantages * turns.keep, excluded)


def left_out_turns(turns: RewardedTurns, advantages: TurnAdvantages, drop_rejected: bool) -> Tensor:
    """``[B, T]``: reached turns whose tokens leave the loss entirely: unscored turns, turns the
    estimator excluded and, with ``drop_rejected`` (Dr. Kernel's PRS), rejected turns."""
    left_out = (turns.reached & ~turns.valid) | advantages.excluded
    if drop_rejected:
        left_out = left_out | (turns.reached & (turns.keep == 0))
    return left_out


# ---------------------------------------------------------------------- 4. over the tokens
def turn_map(turn_indices: Sequence[Sequence[int]], width: int) -> Tensor:
    """``[B, width]``: the turn of every completion token (``Trajectory.turn_index``), -1 for
    feedback tokens and right padding (TRL pads completions on the right to ``width``)."""
    out = torch.full((len(turn_indices), width), -1, dtype=torch.long)
    for row, indices in enumerate(turn_indices):
        if len(indices) > width:
            raise ValueError(f"a completion of {len(indices)} tokens does not fit width {width}")
        out[row, : len(indices)] = torch.as_tensor(list(indices), dtype=torch.long)
    return out


def over_tokens(per_turn: Tensor, tokens: Tensor) -> Tensor:
    """Lay ``per_turn[B, T]`` values over the tokens of ``turn_map``: a token of turn t gets
    ``per_turn[b, t]``; feedback and padding get 0 (False)."""
    values = per_turn.gather(1, tokens.clamp(min=0))
    return torch.where(tokens >= 0, values, torch.zeros_like(values))


@dataclass
class TokenAdvantages:
    """``advantages[B, W]`` of every completion token and ``left_out[B, W]``: tokens that leave
    the loss (on top of TRL's own masks)."""

    advantages: Tensor
    left_out: Tensor


def token_advantages(
    advantages: Tensor,
    left_out: Tensor,
    trajectories: Sequence[Trajectory],
    width: int,
) -> TokenAdvantages:
    """This process's ``advantages[B, T]`` and ``left_out[B, T]`` laid over the tokens of its
    completions (padded to ``width``)."""
    tokens = turn_map([t.turn_index for t in trajectories], width)
    return TokenAdvantages(over_tokens(advantages, tokens), over_tokens(left_out, tokens))


# ---------------------------------------------------------------------- 5. TRL's batch
def into_trl_batch(output: dict[str, Any], tokens: TokenAdvantages, device: Any) -> None:
    """Replace TRL's per-sample ``advantages`` by the per-token ones and take the left-out
    tokens out of its ``tool_mask`` (the mask TRL's loss multiplies by)."""
    output["advantages"] = tokens.advantages.to(device=device, dtype=torch.float32)
    if tokens.left_out.any() and "tool_mask" in output:
        keep = (~tokens.left_out).to(device=device, dtype=output["tool_mask"].dtype)
        output["tool_mask"] = output["tool_mask"] * keep
