"""Profiling-based rejection sampling over hand-built EvalResults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kernelrl.env.result import EvalResult, Status
from kernelrl.rl.advantages import trloo_advantages
from kernelrl.rl.rejection import (
    DrKernelRejectionConfig,
    RejectionConfig,
    drkernel_keep_probability,
    drkernel_rejection_weights,
    rejection_reason,
    rejection_weights,
)


def result(status: Status, **fields) -> EvalResult:
    return EvalResult(task_id="t", backend="triton", status=status, **fields)


BATCH = [
    result(Status.CORRECT, device="cuda", own_kernel_share=0.9, custom_kernel_launches=1),  # kept
    result(Status.CORRECT, device="cuda", own_kernel_share=0.2, custom_kernel_launches=1),  # lazy
    result(Status.INTEGRITY_VIOLATION, checks_failed=["side_stream"]),  # cheat
    result(Status.INCORRECT),  # honest failure: kept
    result(Status.CORRECT, device="cpu", custom_kernel_launches=1),  # CPU: share unknown, kept
    result(Status.COMPILE_ERROR),  # kept
]


def test_drop_mode() -> None:
    weights, stats = rejection_weights(BATCH, RejectionConfig())
    torch.testing.assert_close(weights, torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0]))
    assert stats == {
        "rate": pytest.approx(2 / 6),
        "rejected": 2.0,
        "total": 6.0,
        "integrity": 1.0,
        "low_kernel_share": 1.0,
        "share_unknown": 1.0,
        "unscored": 0.0,
    }


def test_dict_form_accepted() -> None:
    weights, stats = rejection_weights([r.to_dict() for r in BATCH])
    torch.testing.assert_close(weights, torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0]))
    assert stats["rate"] == pytest.approx(2 / 6)


def test_downweight_mode() -> None:
    weights, stats = rejection_weights(BATCH, RejectionConfig(mode="downweight", weight=0.25))
    torch.testing.assert_close(weights, torch.tensor([1.0, 0.25, 0.25, 1.0, 1.0, 1.0]))
    assert stats["rate"] == pytest.approx(2 / 6)


def test_switches() -> None:
    weights, stats = rejection_weights(BATCH, RejectionConfig(drop_integrity_violations=False))
    torch.testing.assert_close(weights, torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 1.0]))
    assert stats["rate"] == pytest.approx(1 / 6) and stats["integrity"] == 0.0
    weights, stats = rejection_weights(BATCH, RejectionConfig(min_own_kernel_share=0.0))
    torch.testing.assert_close(weights, torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0, 1.0]))
    # A stricter threshold also rejects the 0.9 sample.
    weights, _ = rejection_weights(BATCH, RejectionConfig(min_own_kernel_share=0.95))
    torch.testing.assert_close(weights, torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0, 1.0]))


def test_threshold_is_strict() -> None:
    at = result(Status.CORRECT, own_kernel_share=0.5)
    below = result(Status.CORRECT, own_kernel_share=0.4999)
    config = RejectionConfig(min_own_kernel_share=0.5)
    assert rejection_reason(at, config) is None
    assert rejection_reason(below, config) == "low_kernel_share"
    # the dict form a result crossed a process in: read back with its Status
    assert rejection_reason(result(Status.INTEGRITY_VIOLATION).to_dict(), config) == "integrity"


def test_empty_batch() -> None:
    weights, stats = rejection_weights([], RejectionConfig())
    assert weights.shape == (0,) and stats["rate"] == 0.0


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="mode"):
        RejectionConfig(mode="filter")
    with pytest.raises(ValueError):
        RejectionConfig(min_own_kernel_share=1.5)
    with pytest.raises(ValueError):
        RejectionConfig(weight=-0.1)


def test_harness_error_is_not_a_failure_nor_rejected() -> None:
    """Our harness failed: nothing is known about the solution. Not rejected (weight 1, in
    either mode), counted as unscored, and out of the rejection rate's denominator."""
    # Fields that would make it a lazy correct sample if the status were not believed.
    unscored = result(Status.HARNESS_ERROR, own_kernel_share=0.1, checks_failed=["side_stream"])
    config = RejectionConfig()
    assert rejection_reason(unscored, config) is None
    batch = [*BATCH, unscored, unscored.to_dict()]
    for mode in ("drop", "downweight"):
        weights, stats = rejection_weights(batch, RejectionConfig(mode=mode))
        assert weights[-2:].tolist() == [1.0, 1.0]
        assert stats["unscored"] == 2.0 and stats["total"] == 8.0
        assert stats["rejected"] == 2.0  # the lazy and the cheating ones, as without them
        assert stats["rate"] == pytest.approx(2 / 6)  # of the 6 scored samples
        assert stats["share_unknown"] == 1.0
    weights, stats = rejection_weights([unscored])
    assert weights.tolist() == [1.0] and stats["rate"] == 0.0


def test_dropped_samples_leave_the_trloo_baseline() -> None:
    # One group of 3 single-turn samples: rewards 2 (kept), 3 (lazy, dropped), 0 (kept).
    results = [BATCH[0], BATCH[1], BATCH[3]]
    weights, _ = rejection_weights(results)
    rewards = torch.tensor([[[2.0], [3.0], [0.0]]])
    valid = (weights > 0).view(1, 3, 1)
    # s0: 2 - 0 = 2;  s1 dropped -> 0;  s2: 0 - 2 = -2 (the lazy 3.0 enters no baseline)
    torch.testing.assert_close(
        trloo_advantages(rewards, valid), torch.tensor([[[2.0], [0.0], [-2.0]]])
    )


def test_config_fields_sit_beside_grpo_config() -> None:
    # Recipes parse GRPOConfig, RewardConfig and RejectionConfig with one flat TrlParser:
    # their field names must not collide.
    import dataclasses

    from trl import GRPOConfig, TrlParser

    from kernelrl.rewards import RewardConfig

    names = [
        {f.name for f in dataclasses.fields(c)} for c in (GRPOConfig, RewardConfig, RejectionConfig)
    ]
    assert not (names[0] & names[1]) and not (names[0] & names[2]) and not (names[1] & names[2])
    reward, rejection = TrlParser((RewardConfig, RejectionConfig)).parse_args_into_dataclasses(
        ["--mode", "downweight", "--weight", "0.3", "--speedup_baseline", "compile"]
    )
    assert rejection == RejectionConfig(mode="downweight", weight=0.3)
    assert reward.speedup_baseline == "compile"


def test_real_h100_results_lazy_and_cheat_rejected() -> None:
    # Real EvalResults from an H100; see tests/rewards/test_rewards.py for what they are.
    path = Path(__file__).parents[1] / "fixtures" / "rewards_h100_eval_results.jsonl"
    results = [EvalResult.from_dict(json.loads(line)) for line in path.read_text().splitlines()]
    weights, stats = rejection_weights(results)
    # Eight honest bundled solutions kept; the torch-matmul cheat and the lazy ReLU
    # (own kernel share 0.05) rejected.
    torch.testing.assert_close(weights, torch.tensor([1.0] * 8 + [0.0, 0.0]))
    assert stats["integrity"] == 1.0 and stats["low_kernel_share"] == 1.0
    assert stats["rate"] == pytest.approx(0.2)


# --------------------------------------------------------------------------- Dr. Kernel's PRS
def gpu(status: Status, share: float | None) -> EvalResult:
    return result(status, device="cuda", own_kernel_share=share, custom_kernel_launches=1)


@pytest.mark.parametrize(
    ("share", "expected"),
    [(0.0, 0.0), (0.25, 0.0), (0.3, 0.0), (0.325, 0.25), (0.35, 0.5), (0.4, 1.0), (0.9, 1.0)],
)
def test_drkernel_keep_probability_ramp(share: float, expected: float) -> None:
    # clamp((share - 0.3) / 0.1, 0, 1) for a correct turn.
    assert drkernel_keep_probability(gpu(Status.CORRECT, share)) == pytest.approx(expected)


def test_drkernel_keep_probability_other_turns() -> None:
    # Only correct turns are judged; a cheat is not correct (its reward is 0), so it is kept.
    for status in (Status.INCORRECT, Status.INTEGRITY_VIOLATION, Status.COMPILE_ERROR,
                   Status.HARNESS_ERROR):  # fmt: skip
        assert drkernel_keep_probability(gpu(status, 0.0)) == 1.0
    assert drkernel_keep_probability(gpu(Status.CORRECT, None)) is None  # CPU: cannot judge
    hard = DrKernelRejectionConfig(threshold=0.3, ramp=0.0)  # factor 0: a hard cut at >= 0.3
    assert drkernel_keep_probability(gpu(Status.CORRECT, 0.3), hard) == 1.0
    assert drkernel_keep_probability(gpu(Status.CORRECT, 0.29), hard) == 0.0
    with pytest.raises(ValueError, match="ramp"):
        DrKernelRejectionConfig(ramp=-0.1)
    with pytest.raises(ValueError, match="threshold"):
        DrKernelRejectionConfig(threshold=1.5)


def test_drkernel_rejection_weights_and_stats() -> None:
    batch = [
        gpu(Status.CORRECT, 0.9),  # kept
        gpu(Status.CORRECT, 0.1),  # rejected for sure
        gpu(Status.CORRECT, None),  # CPU-like: share unknown, kept
        gpu(Status.INCORRECT, 0.0),  # kept
        result(Status.HARNESS_ERROR),  # unscored, kept
    ]
    weights, stats = drkernel_rejection_weights(batch, generator=torch.Generator().manual_seed(1))
    assert weights.tolist() == [1.0, 0.0, 1.0, 1.0, 1.0]
    assert stats["rejected"] == 1.0 and stats["low_kernel_share"] == 1.0
    assert stats["rate"] == pytest.approx(1 / 4)  # of the scored turns
    assert stats["share_unknown"] == 1.0 and stats["unscored"] == 1.0
    assert stats["expected_rejected"] == pytest.approx(1.0)


def test_drkernel_rejection_draws_are_seeded_and_follow_the_probability() -> None:
    batch = [gpu(Status.CORRECT, 0.35)] * 4000  # keep probability 0.5
    first, _ = drkernel_rejection_weights(batch, generator=torch.Generator().manual_seed(7))
    again, _ = drkernel_rejection_weights(batch, generator=torch.Generator().manual_seed(7))
    assert torch.equal(first, again)
    assert abs(first.mean().item() - 0.5) < 0.04  # 4000 draws: sd 0.008
    quarter, _ = drkernel_rejection_weights(
        [gpu(Status.CORRECT, 0.325)] * 4000, generator=torch.Generator().manual_seed(3)
    )
    assert abs(quarter.mean().item() - 0.25) < 0.04
