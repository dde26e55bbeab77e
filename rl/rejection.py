"""Profiling-based rejection sampling: drop or down-weight samples before the policy update.

A sample is *rejected* when it

- cheated: status ``integrity_violation`` (when ``drop_integrity_violations``), or
- is correct but lazy: its own kernels did less than ``min_own_kernel_share`` of the GPU time,
  leaving the real work to torch (its reward would teach wrapping a trivial kernel around
  library calls).

Rejected samples get weight 0 (``mode="drop"``) or ``weight`` (``mode="downweight"``); the
others weight 1. Multiply the per-sample advantages (or the per-token loss mask) by the
weights; to keep dropped samples out of the group baselines too, pass ``weights > 0`` as (part
of) ``valid`` to ``trloo_advantages``.

Honest and failed samples (incorrect, compile/runtime errors, timeouts, format errors) are kept:
they are the negative examples the policy learns from, and they carry no profile to judge.
On CPU a correct result has no profile (``own_kernel_share`` is None): its share cannot be
judged, so it is not rejected on share; it is counted as ``share_unknown`` in the stats. (A
correct CPU result has passed the ``no_kernel_executed`` and ``torch_fallback_runtime``
dynamic checks, the CPU-side evidence that its kernels did the work.)

Unscored samples (status ``harness_error``: kernelrl's harness failed, not the solution) are
neither a failure nor rejected: nothing is known about them. They keep weight 1 (they carry no
reward and get advantage 0 anyway, see ``kernelrl.rl.advantages``), are counted as ``unscored``
and left out of the rejection rate, which is a share of the *scored* samples.

``rejection_weights(results, config) -> (weights[N] float32, stats)``; stats hold ``rate``
(rejected / scored samples, to log), ``rejected``, ``integrity``, ``low_kernel_share``,
``share_unknown``, ``unscored`` and ``total``.

Presets (``REJECTION_PRESETS``): the above is ``kernelrl``'s. ``drkernel`` is Dr. Kernel's
profiling-based rejection sampling (PRS) as KernelGYM ships it (``compute_rollout_rejection_mask``
with ``coverage_rs="turn"``, threshold 0.3, factor 0.1, key ``time_coverage``): each *correct*
turn is kept with probability ``clamp((share - threshold) / ramp, 0, 1)`` (a Bernoulli draw; a
ramp of 0 is the hard cut ``share >= threshold``), every other turn is kept. Integrity
violations are not correct, so they are kept: their reward is 0 (Dr. Kernel's failed hack), not
a rejection. A kept-or-not draw needs a ``torch.Generator`` so that a run is reproducible.
Where ours differs by necessity: a correct result without a profile (CPU) cannot be judged and is
kept (``share_unknown``); KernelGYM never runs on CPU, and there a missing profile reads as share
0, which would reject every correct CPU turn. Unscored results (``harness_error``) are kept at
weight 1, as above. ``drkernel_keep_probability`` and ``drkernel_rejection_weights`` implement
it; in Dr. Kernel a rejected turn leaves the loss (its tokens are masked) but stays in the
baseline of the others (``kernelrl.rl.advantages.drkernel_trloo_advantages``).

``RejectionSampling``: the rejection keys of a training recipe (on/off, preset, both presets'
settings), parsed next to ``KernelGRPOConfig`` (``kernelrl.rl.config.TRAIN_RECIPE``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

from kernelrl.env.result import EvalResult, Status, is_scored
from kernelrl.rewards import as_eval_result

RejectionMode = Literal["drop", "downweight"]
REJECTION_PRESETS = ("kernelrl", "drkernel")


@dataclass
class RejectionConfig:
    """Which samples are rejected and what weight they keep."""

    min_own_kernel_share: float = field(
        default=0.5,
        metadata={
            "help": "reject correct samples whose own kernels did less of the GPU time; 0 disables"
        },
    )
    drop_integrity_violations: bool = field(
        default=True, metadata={"help": "reject samples with status integrity_violation"}
    )
    mode: str = field(
        default="drop", metadata={"help": "'drop' (weight 0) or 'downweight' (weight)"}
    )
    weight: float = field(
        default=0.1, metadata={"help": "weight of a rejected sample in downweight mode"}
    )

    def __post_init__(self) -> None:
        if self.mode not in ("drop", "downweight"):
            raise ValueError(f"mode must be 'drop' or 'downweight', got {self.mode!r}")
        if not 0.0 <= self.min_own_kernel_share <= 1.0:
            raise ValueError(
                f"min_own_kernel_share must lie in [0, 1], got {self.min_own_kernel_share}"
            )
        if not 0.0 <= self.weight <= 1.0:
            raise ValueError(f"weight must lie in [0, 1], got {self.weight}")

    @property
    def rejected_weight(self) -> float:
        return 0.0 if self.mode == "drop" else self.weight


def rejection_reason(result: EvalResult | dict[str, Any], config: RejectionConfig) -> str | None:
    """``"integrity"``, ``"low_kernel_share"`` or None (kept; also for an unscored
    ``harness_error``, which says nothing about the solution)."""
    result = as_eval_result(result)
    status = result.status
    if not is_scored(result):
        return None
    if status is Status.INTEGRITY_VIOLATION:
        return "integrity" if config.drop_integrity_violations else None
    share = result.own_kernel_share
    if status is Status.CORRECT and share is not None and share < config.min_own_kernel_share:
        return "low_kernel_share"
    return None


def rejection_weights(
    results: Sequence[EvalResult | dict[str, Any]], config: RejectionConfig | None = None
) -> tuple[Tensor, dict[str, float]]:
    """Per-sample weights (1 kept, 0 or ``weight`` rejected) and stats with the rejection rate.

    ``results`` are EvalResults or their ``to_dict`` form, one per sample.
    """
    config = config or RejectionConfig()
    results = [as_eval_result(r) for r in results]
    weights = torch.ones(len(results), dtype=torch.float32)
    counts = {"integrity": 0, "low_kernel_share": 0, "share_unknown": 0, "unscored": 0}
    for index, result in enumerate(results):
        if not is_scored(result):
            counts["unscored"] += 1
            continue
        reason = rejection_reason(result, config)
        if reason is not None:
            weights[index] = config.rejected_weight
            counts[reason] += 1
        elif result.status is Status.CORRECT and result.own_kernel_share is None:
            counts["share_unknown"] += 1
    rejected = counts["integrity"] + counts["low_kernel_share"]
    stats: dict[str, float] = {
        "rate": rejected / max(len(results) - counts["unscored"], 1),
        "rejected": float(rejected),
        "total": float(len(results)),
        **{key: float(value) for key, value in counts.items()},
    }
    return weights, stats


@dataclass
class DrKernelRejectionConfig:
    """Dr. Kernel's profiling-based rejection (PRS): keep a correct turn with probability
    ``clamp((share - threshold) / ramp, 0, 1)``; KernelGYM's ``coverage_rs_threshold`` and
    ``coverage_rs_factor``."""

    threshold: float = field(
        default=0.3,
        metadata={"help": "own-kernel share at or under which a correct turn is dropped"},
    )
    ramp: float = field(
        default=0.1,
        metadata={"help": "share above the threshold at which a correct turn is always kept"},
    )

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold must lie in [0, 1], got {self.threshold}")
        if self.ramp < 0:
            raise ValueError(f"ramp must be >= 0, got {self.ramp}")


def drkernel_keep_probability(
    result: EvalResult | dict[str, Any], config: DrKernelRejectionConfig | None = None
) -> float | None:
    """Probability of keeping one turn under Dr. Kernel's PRS; None when the result is correct
    but has no profile (CPU: the share cannot be judged, the turn is kept)."""
    config = config or DrKernelRejectionConfig()
    result = as_eval_result(result)
    if result.status is not Status.CORRECT:
        return 1.0  # only correct turns are subject to PRS (harness errors included: unscored)
    share = result.own_kernel_share
    if share is None:
        return None
    if config.ramp == 0:
        return 1.0 if share >= config.threshold else 0.0
    return min(max((float(share) - config.threshold) / config.ramp, 0.0), 1.0)


def drkernel_rejection_weights(
    results: Sequence[EvalResult | dict[str, Any]],
    config: DrKernelRejectionConfig | None = None,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Per-turn keep weights (1 kept, 0 rejected, drawn from ``drkernel_keep_probability``) and
    the same stats as ``rejection_weights`` (``low_kernel_share`` counts the rejected draws;
    ``expected_rejected`` is the sum of the rejection probabilities)."""
    config = config or DrKernelRejectionConfig()
    results = [as_eval_result(r) for r in results]
    probabilities = torch.ones(len(results), dtype=torch.float64)
    counts = {"integrity": 0, "low_kernel_share": 0, "share_unknown": 0, "unscored": 0}
    for index, result in enumerate(results):
        if not is_scored(result):
            counts["unscored"] += 1
            continue
        p = drkernel_keep_probability(result, config)
        if p is None:
            counts["share_unknown"] += 1
        else:
            probabilities[index] = p
    weights = torch.bernoulli(probabilities, generator=generator).float()
    counts["low_kernel_share"] = int((weights == 0).sum())
    scored = len(results) - counts["unscored"]
    stats: dict[str, float] = {
        "rate": counts["low_kernel_share"] / max(scored, 1),
        "rejected": float(counts["low_kernel_share"]),
        "expected_rejected": float((1 - probabilities).sum()),
        "total": float(len(results)),
        **{key: float(value) for key, value in counts.items()},
    }
    return weights, stats


@dataclass
class RejectionSampling:
    """The rejection keys of a training recipe (parsed next to ``KernelGRPOConfig``).

    Prefixed because a flat recipe's ``mode`` or ``weight`` would say nothing; ``config()`` and
    ``drkernel_config()`` are the configs of the two presets' functions above."""

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

    def __post_init__(self) -> None:
        if self.rejection_preset not in REJECTION_PRESETS:
            raise ValueError(
                f"rejection_preset must be one of {REJECTION_PRESETS}, got "
                f"{self.rejection_preset!r}"
            )
        if self.rejection_preset == "drkernel":
            # The preset defines these exactly: one set to another value would be ignored.
            keys = ("min_own_kernel_share", "drop_integrity_violations", "mode", "weight")
            defaults = RejectionSampling.__dataclass_fields__
            changed = [
                f"rejection_{k}"
                for k in keys
                if getattr(self, f"rejection_{k}") != defaults[f"rejection_{k}"].default
            ]
            if changed:
                raise ValueError(
                    f"rejection_preset=drkernel defines {', '.join(changed)}; remove "
                    f"{'them' if len(changed) > 1 else 'it'} or set rejection_preset: kernelrl"
                )
        self.config()  # a bad value fails when the recipe is parsed
        self.drkernel_config()

    def config(self) -> RejectionConfig:
        """``rejection_weights``' config (preset ``kernelrl``)."""
        return RejectionConfig(
            min_own_kernel_share=self.rejection_min_own_kernel_share,
            drop_integrity_violations=self.rejection_drop_integrity_violations,
            mode=self.rejection_mode,
            weight=self.rejection_weight,
        )

    def drkernel_config(self) -> DrKernelRejectionConfig:
        """``drkernel_rejection_weights``' config (preset ``drkernel``)."""
        return DrKernelRejectionConfig(
            threshold=self.drkernel_prs_threshold, ramp=self.drkernel_prs_ramp
        )
