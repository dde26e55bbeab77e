"""Advantage estimators: GRPO (group mean/std, as TRL) and TRLOO (turn-level leave-one-out).

Pure tensor functions, no trainer state, so they are tested against hand-computed numbers.

- ``grpo_advantages(rewards[N], group_size, scale=True, eps=1e-4)``: ``N`` rewards laid out
  group after group (TRL's order: the ``group_size`` generations of one prompt are
  consecutive). ``A = r - mean_group``, divided by ``std_group + eps`` when ``scale``, with the
  unbiased std, exactly as ``GRPOTrainer`` with ``scale_rewards="group"`` (``"none"`` when not
  ``scale``). NaN rewards (unscorable) are left out of the group statistics and get
  advantage 0, as TRL does.
- ``trloo_advantages(rewards[G, K, T], valid[G, K, T])``: group g, sample k, turn t. The
  baseline of (g, k, t) is the mean reward of the *other* valid samples of group g at turn t,
  ``b = sum_{j != k, valid[g, j, t]} r[g, j, t] / n_others``, so a sample never enters its own
  baseline (the RLOO estimator, unbiased, unlike GRPO's mean which includes the sample and
  shrinks every advantage by ``(K - 1) / K``). Invalid entries - a turn the sample never
  reached, or a sample excluded as failed/truncated/rejected - get advantage 0 and are left out
  of every other sample's baseline. With no other valid sample at that turn there is no
  baseline; rather than invent one (0, or the sample's own reward), the advantage is 0: no
  baseline, no signal. No std scaling: leave-one-out differences are already on the reward's
  scale, and std scaling biases towards groups with little spread (Dr. GRPO).
- ``leave_one_out_advantages(rewards[N], group_size, valid=None)``: TRLOO for single-turn
  batches in TRL's flat layout; NaN rewards count as invalid.
- ``pack_turns(samples, group_size)`` / ``unpack_turns(values, valid)``: between ragged
  per-sample turn rewards (``list[list[float | None]]``, None for an excluded sample; samples
  laid out group after group) and the ``[G, K, T]`` grid with its ``valid`` mask. A turn reward
  that is None or NaN is an *unscored* turn (its EvalResult was a ``harness_error``: kernelrl
  failed, not the solution): invalid, like an unreached turn, never 0.

Unscored samples (``harness_error``, see ``kernelrl.env.result.Status``): their reward is NaN /
None, never 0. Every estimator here leaves them out of their group's baseline (and GRPO's std)
and gives them advantage 0; a group with no scored sample gets advantage 0 throughout, no NaN.
A group of 4 with one unscored sample is a group of 3 for its baseline.
- ``turn_returns(rewards[G, K, T], valid, mode, gamma)``: the return credited to each turn.
  ``"own"``: the turn's own reward. ``"discounted"``: ``R_t = sum_{s >= t, valid_s}
  gamma^(s - t) r_s``, so a turn that sets up a later fix is credited for it. Invalid turns
  return 0. Feed the returns to ``trloo_advantages`` for multi-turn training.

Dr. Kernel's TRLOO, exactly as KernelGYM ships it (``compute_multi_turn_rloo_outcome_advantage``
with ``compute_multi_turn_returns``; ``ADVANTAGE_ESTIMATORS``: ``grpo``, ``trloo`` (ours) and
``drkernel_trloo``):

- ``drkernel_trloo_advantages(rewards[G, K, T], reached, valid, gamma)``: returns-to-go
  ``G_t = r_t + gamma * G_{t+1}`` (``G_T = r_T``; a turn a sample never reached holds reward 0),
  and ``A_t^i = G_t^i - mean_{j != i} G_t^j`` over the *other* samples of the same group that
  took part at turn t. Where it differs from ours: (a) the return is always the discounted
  return-to-go (gamma 1 in their 14B recipe); (b) a sample alone at its turn (a group of one, or
  the only sample that reached turn t) gets its return as the advantage, with no baseline
  (ours: 0); (c) rejected turns (profiling-based rejection) stay in the other samples' baselines
  and only leave the loss (ours: out of both). A failed turn (reward 0) is a sample like any
  other. Unscored turns keep our convention, in the form Dr. Kernel gives failed rollouts (an
  error masks the trajectory): a return that would sum an unscored turn's unknown reward is
  unknown, so every turn at or before an unscored one is left out of every baseline and gets
  advantage 0; since an unscored turn ends its rollout, that is the whole sample.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

ReturnMode = Literal["own", "discounted"]
ADVANTAGE_ESTIMATORS = ("grpo", "trloo", "drkernel_trloo")


def grpo_advantages(
    rewards: Tensor, group_size: int, scale: bool = True, eps: float = 1e-4
) -> Tensor:
    """GRPO advantages of ``rewards[N]`` (N a multiple of ``group_size``), as TRL computes them."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    grouped = rewards.double().view(-1, group_size)
    scored = ~torch.isnan(grouped)
    count = scored.sum(dim=1, keepdim=True)
    values = torch.where(scored, grouped, torch.zeros_like(grouped))
    mean = values.sum(dim=1, keepdim=True) / count.clamp(min=1)
    advantages = grouped - mean
    if scale:
        squares = torch.where(scored, advantages**2, torch.zeros_like(grouped))
        # Unbiased std (count - 1), as TRL's nanstd; a group of one has no spread.
        std = (squares.sum(dim=1, keepdim=True) / (count - 1).clamp(min=1)).sqrt()
        std = torch.where(count > 1, std, torch.zeros_like(std))
        advantages = advantages / (std + eps)
    advantages = torch.where(scored, advantages, torch.zeros_like(advantages))
    return advantages.view(-1).to(rewards.dtype if rewards.is_floating_point() else torch.float32)


def _check_grid(rewards: Tensor, valid: Tensor) -> None:
    if rewards.dim() != 3:
        raise ValueError(
            f"rewards must be [G, K, T] (groups, samples, turns), got shape {tuple(rewards.shape)}"
        )
    if valid.shape != rewards.shape:
        raise ValueError(f"valid has shape {tuple(valid.shape)}, rewards {tuple(rewards.shape)}")
    if valid.dtype != torch.bool:
        raise TypeError(f"valid must be a bool tensor, got {valid.dtype}")
    if torch.isnan(rewards[valid]).any():
        raise ValueError("a valid entry has a NaN reward; mark it invalid instead")


def trloo_advantages(rewards: Tensor, valid: Tensor) -> Tensor:
    """Turn-level leave-one-out advantages of ``rewards[G, K, T]``; see the module docstring."""
    _check_grid(rewards, valid)
    values = torch.where(valid, rewards, torch.zeros_like(rewards))
    # Per (group, turn): sum and count over valid samples; remove the sample itself.
    others_sum = values.sum(dim=1, keepdim=True) - values
    others_count = valid.sum(dim=1, keepdim=True) - valid.long()
    baseline = others_sum / others_count.clamp(min=1)
    has_signal = valid & (others_count > 0)
    return torch.where(has_signal, rewards - baseline, torch.zeros_like(rewards))


def turn_returns(
    rewards: Tensor, valid: Tensor, mode: ReturnMode = "own", gamma: float = 1.0
) -> Tensor:
    """Return of each turn of ``rewards[G, K, T]``: its own reward or the discounted sum of its
    own and later valid rewards (``gamma`` in [0, 1]); 0 for invalid turns."""
    _check_grid(rewards, valid)
    values = torch.where(valid, rewards, torch.zeros_like(rewards))
    if mode == "own":
        return values
    if mode != "discounted":
        raise ValueError(f"mode must be 'own' or 'discounted', got {mode!r}")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must lie in [0, 1], got {gamma}")
    returns = torch.zeros_like(values)
    running = torch.zeros_like(values[..., 0])
    for t in range(values.shape[-1] - 1, -1, -1):
        # Invalid turns add nothing but still count in the discount exponent (s - t).
        running = values[..., t] + gamma * running
        returns[..., t] = running
    return torch.where(valid, returns, torch.zeros_like(returns))


def drkernel_trloo_advantages(
    rewards: Tensor, reached: Tensor, valid: Tensor, gamma: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Dr. Kernel's TRLOO on ``rewards[G, K, T]``; see the module docstring.

    ``reached[g, k, t]``: sample k of group g generated turn t; ``valid``: that turn was scored
    (``valid`` implies ``reached``; reached and not valid is an unscored turn, whose reward is
    ignored). Returns ``(advantages[G, K, T], included[G, K, T])``, where ``included`` marks the
    turns that entered the baselines and carry an advantage.
    """
    if reached.shape != rewards.shape or reached.dtype != torch.bool:
        raise ValueError("reached must be a bool tensor shaped like rewards")
    _check_grid(rewards, valid)
    if (valid & ~reached).any():
        raise ValueError("a valid turn must be a reached turn")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must lie in [0, 1], got {gamma}")
    values = torch.where(valid, rewards, torch.zeros_like(rewards))
    returns = torch.zeros_like(values)
    running = torch.zeros_like(values[..., 0])
    unscored_ahead = torch.zeros_like(valid[..., 0])
    included = torch.zeros_like(valid)
    for t in range(values.shape[-1] - 1, -1, -1):
        running = values[..., t] + gamma * running
        returns[..., t] = running
        unscored_ahead = unscored_ahead | (reached[..., t] & ~valid[..., t])
        included[..., t] = reached[..., t] & ~unscored_ahead
    kept = torch.where(included, returns, torch.zeros_like(returns))
    count = included.sum(dim=1, keepdim=True)
    others = (kept.sum(dim=1, keepdim=True) - kept) / (count - 1).clamp(min=1)
    advantages = torch.where(count > 1, returns - others, returns)
    return torch.where(included, advantages, torch.zeros_like(advantages)), included


def leave_one_out_advantages(
    rewards: Tensor, group_size: int, valid: Tensor | None = None
) -> Tensor:
    """Single-turn TRLOO on ``rewards[N]`` laid out group after group (TRL's order).

    NaN rewards (unscorable) are invalid; ``valid[N]`` can exclude more (e.g. rejected samples).
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    mask = ~torch.isnan(rewards)
    if valid is not None:
        if valid.shape != rewards.shape or valid.dtype != torch.bool:
            raise ValueError("valid must be a bool tensor shaped like rewards")
        mask = mask & valid
    grid = rewards.view(-1, group_size, 1)
    return trloo_advantages(grid, mask.view(-1, group_size, 1)).view(-1)


def pack_turns(
    samples: Sequence[Sequence[float | None] | None],
    group_size: int,
    max_turns: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Ragged per-sample turn rewards -> ``(rewards[G, K, T], valid[G, K, T])``.

    ``samples[i]`` holds the rewards of the turns sample i reached (sample i belongs to group
    ``i // group_size``), or None when the sample is excluded (failed, truncated, rejected).
    A reward that is None or NaN is an unscored turn (harness_error): invalid, holds 0.
    ``T`` is ``max_turns`` or the longest sample; unreached turns are invalid and hold 0.
    """
    if group_size < 1 or len(samples) % group_size:
        raise ValueError(f"{len(samples)} samples do not split into groups of {group_size}")
    longest = max((len(s) for s in samples if s is not None), default=0)
    turns = longest if max_turns is None else max_turns
    if longest > turns:
        raise ValueError(f"a sample has {longest} turns, more than max_turns={turns}")
    rewards = torch.zeros(len(samples), turns, dtype=torch.float32)
    valid = torch.zeros(len(samples), turns, dtype=torch.bool)
    for index, sample in enumerate(samples):
        if sample:
            values = torch.tensor(
                [math.nan if r is None else float(r) for r in sample], dtype=torch.float32
            )
            scored = ~torch.isnan(values)
            rewards[index, : len(sample)] = torch.where(scored, values, torch.zeros(()))
            valid[index, : len(sample)] = scored
    shape = (len(samples) // group_size, group_size, turns)
    return rewards.view(shape), valid.view(shape)


def unpack_turns(values: Tensor, valid: Tensor) -> list[list[float]]:
    """``values[G, K, T]`` -> per-sample lists of the values at valid turns (inverse of
    ``pack_turns`` for samples whose valid turns form a prefix, i.e. no unscored turn before a
    scored one; an excluded sample gives [])."""
    _check_grid(values, valid)
    flat_values = values.reshape(-1, values.shape[-1])
    flat_valid = valid.reshape(-1, valid.shape[-1])
    return [row[mask].tolist() for row, mask in zip(flat_values, flat_valid, strict=True)]
