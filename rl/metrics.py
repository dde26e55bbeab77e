"""What the trainer logs about a batch, computed from the step records of ``kernelrl.rl.steps``.

Pure functions returning ``{name: value}``; the trainer appends them to TRL's metric buffers
(``kernelrl.rl.compat.metrics``), which TRL averages and logs at each logging step.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import numpy as np
import torch

from kernelrl.env.result import EvalResult, Status
from kernelrl.rewards import speed_unjudged, weighted_total
from kernelrl.rl.steps import RewardedTurns, RolloutBatch, TurnAdvantages

STOP_REASONS = ("correct", "max_turns", "context", "env_error")
REJECTION_KEYS = ("integrity", "low_kernel_share", "share_unknown")


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
    total = weighted_total(per_turn, weights)
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


def repeated_share(results: list[EvalResult]) -> float:
    """The share of a batch's evaluations whose (task, solution) another evaluation of the batch
    already had: what a results store (``env_store_path``) answers without evaluating again."""
    if not results:
        return 0.0
    return 1.0 - len({(r.task_hash, r.solution_hash) for r in results}) / len(results)


def rollout_metrics(
    batch: RolloutBatch,
    local: RewardedTurns,
    turns: RewardedTurns,
    advantages: TurnAdvantages,
    global_step: int,
) -> dict[str, float]:
    """Turns, environment verdicts, rejection, staleness, timings and advantage size of one
    batch. ``batch`` and ``local``: this process's samples; ``turns`` and ``advantages``: every
    process's (the rewards and advantages trained on)."""
    trajectories = batch.trajectories
    rewards, valid, keep = turns.rewards, turns.valid, turns.keep
    out: dict[str, float] = {}
    for t in range(rewards.shape[1]):
        reached = valid[:, t]
        if reached.any():
            out[f"turns/reward_turn{t}"] = rewards[reached, t].mean().item()
    out["turns/mean"] = float(np.mean([len(t.turns) for t in trajectories]))
    reasons = collections.Counter(t.stop_reason for t in trajectories)
    for reason in STOP_REASONS:
        out[f"turns/stop_{reason}"] = reasons[reason] / len(trajectories)
    judged: list[EvalResult] = []
    finals: list[bool] = []
    for trajectory in trajectories:
        results = trajectory.results()
        judged += [r for r in results if r is not None]
        finals.append(bool(results and results[-1] is not None and results[-1].correct))
    statuses = collections.Counter(str(r.status) for r in judged)
    evaluated = max(sum(statuses.values()), 1)
    for status in Status:
        out[f"env/{status}"] = statuses[status] / evaluated
    # Unscored turns: our harness failed (after the pool's retry) or no result came back.
    generated = max(sum(len(t.turns) for t in trajectories), 1)
    unscored = sum(not turn.scored for t in trajectories for turn in t.turns)
    out["env/harness_error_frac"] = statuses[Status.HARNESS_ERROR] / evaluated
    out["env/unscored_turn_frac"] = unscored / generated
    # Correct on a GPU without a judged speed (timing unused, speed-up missing): no reward.
    out["env/speed_unjudged_frac"] = sum(map(speed_unjudged, judged)) / evaluated
    out["env/correct_final"] = float(np.mean(finals))
    out["env/repeated_frac"] = repeated_share(judged)
    out["rejection/rate"] = ((keep < 1) & valid).sum().item() / max(valid.sum().item(), 1)
    for key in REJECTION_KEYS:
        out[f"rejection/{key}"] = float(local.rejection.get(key, 0))
    out["rollout/staleness"] = float(np.mean([global_step - t.policy_step for t in trajectories]))
    out["timing/generation_s"] = batch.stats.generation_s
    out["timing/turn_eval_wait_s"] = batch.stats.evaluation_wait_s
    values = advantages.advantages
    out["advantage/abs_mean"] = values[valid].abs().mean().item() if valid.any() else 0.0
    return out
