"""The two decisions of asynchronous training that are pure arithmetic: which groups a step
trains, and how much a stale token counts.

Which groups (``plan_step``): every group of samples has a deadline, the last optimizer step
that may still train it, ``version + max_staleness`` (``version``: the policy version, i.e. the
optimizer step, of the oldest weights that wrote any of its turns). Each step trains exactly
``count`` groups per process. Groups whose evaluations are all in are preferred, so that a group
still waiting on the environment carries over to a later step (a partial rollout) instead of
stalling the update; but no group may miss its deadline, so the groups that later steps could
not all absorb are forced into this one (earliest deadline first, the schedule that meets every
deadline whenever any schedule does), and the step waits for them. With ``max_staleness: 0``
every group's deadline is the step it was generated for: the synchronous schedule.

How much (``importance_weights``): a token sampled by an older policy ``mu`` is trained with the
weight ``pi_old / mu`` (``pi_old``: the weights of this step, before its update), truncated or
masked exactly as TRL's ``vllm_importance_sampling_mode`` does for vLLM's sampling mismatch, so
one correction covers both the engine's numerics and the policy's age.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

IMPORTANCE_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


@dataclass(frozen=True)
class Slot:
    """One group that generation started and no step has trained yet."""

    key: object  # what the caller identifies the group by
    order: int  # its position in the data order
    version: int  # policy version of the oldest weights that generated a turn of it
    complete: bool  # every turn generated and judged

    def deadline(self, max_staleness: int) -> int:
        return self.version + max_staleness


class ScheduleError(RuntimeError):
    """The groups in flight cannot all be trained within the staleness bound."""


def plan_step(slots: Sequence[Slot], step: int, count: int, max_staleness: int) -> list[Slot]:
    """The ``count`` groups optimizer step ``step`` trains, in data order (see the module
    docstring). Incomplete groups among them are the ones the step must wait for."""
    if len(slots) < count:
        raise ScheduleError(f"step {step} needs {count} groups, {len(slots)} are in flight")
    missed = [s for s in slots if s.deadline(max_staleness) < step]
    if missed:
        raise ScheduleError(
            f"{len(missed)} groups passed their last step (first: version {missed[0].version}, "
            f"step {step}, max_staleness {max_staleness})"
        )
    chosen: list[Slot] = []
    for deadline in sorted({s.deadline(max_staleness) for s in slots}):
        due = [s for s in slots if s.deadline(max_staleness) <= deadline]
        # what the steps after this one can absorb before `deadline`: (deadline - step) steps
        need = len(due) - (deadline - step) * count
        have = sum(1 for s in chosen if s.deadline(max_staleness) <= deadline)
        if need > have:
            free = [s for s in due if s not in chosen]
            free.sort(key=lambda s: (not s.complete, s.deadline(max_staleness), s.order))
            chosen += free[: need - have]
    if len(chosen) > count:
        raise ScheduleError(
            f"step {step} would have to train {len(chosen)} groups to keep max_staleness "
            f"{max_staleness}, it trains {count}"
        )
    rest = [s for s in slots if s not in chosen]
    rest.sort(key=lambda s: (not s.complete, s.deadline(max_staleness), s.order))
    chosen += rest[: count - len(chosen)]
    return sorted(chosen, key=lambda s: s.order)


def importance_weights(
    current: Tensor,
    behaviour: Tensor,
    mask: Tensor,
    mode: str = "token_truncate",
    clip_min: float | None = None,
    clip_max: float | None = 3.0,
) -> Tensor:
    """``[B, T]`` weights of the tokens of ``mask`` (1 elsewhere): ``exp(current -
    behaviour)`` per token, or per sequence for the ``sequence_*`` modes, truncated into
    ``[clip_min, clip_max]`` (``*_truncate``) or zeroed outside it (``*_mask``), as TRL's
    ``vllm_importance_sampling_mode``."""
    if mode not in IMPORTANCE_MODES:
        raise ValueError(f"importance sampling mode must be one of {IMPORTANCE_MODES}: {mode!r}")
    mask = mask.bool()
    diff = torch.where(mask, current - behaviour, torch.zeros_like(current))
    if mode.startswith("sequence"):
        diff = diff.sum(dim=1, keepdim=True).expand_as(diff)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        ratio = torch.clamp(ratio, min=clip_min, max=clip_max)
    else:
        low = float("-inf") if clip_min is None else clip_min
        high = float("inf") if clip_max is None else clip_max
        ratio = ratio.masked_fill((ratio < low) | (ratio > high), 0.0)
    return torch.where(mask, ratio, torch.ones_like(ratio))
