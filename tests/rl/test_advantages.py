"""GRPO and TRLOO advantage estimators, ours and Dr. Kernel's, against hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from kernelrl.rl.advantages import (
    drkernel_trloo_advantages,
    grpo_advantages,
    leave_one_out_advantages,
    pack_turns,
    trloo_advantages,
    turn_returns,
    unpack_turns,
)

T, F = True, False


def close(actual: torch.Tensor, expected: list) -> None:
    torch.testing.assert_close(
        actual, torch.tensor(expected, dtype=actual.dtype), rtol=1e-6, atol=1e-6
    )


# --------------------------------------------------------------------------- GRPO
def test_grpo_hand_computed() -> None:
    rewards = torch.tensor([1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0, 0.0])
    # Group 1: mean 2.5, deviations [-1.5, -0.5, 0.5, 1.5];
    # unbiased var = (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3, std = 1.2909944.
    # Group 2: all equal, deviations 0, std 0 -> advantages 0.
    std = math.sqrt(5 / 3) + 1e-4
    close(grpo_advantages(rewards, 4), [-1.5 / std, -0.5 / std, 0.5 / std, 1.5 / std, 0, 0, 0, 0])
    close(grpo_advantages(rewards, 4, scale=False), [-1.5, -0.5, 0.5, 1.5, 0, 0, 0, 0])
    # Groups of 2: [1, 2] mean 1.5, std sqrt(0.5); [3, 4] likewise.
    s2 = math.sqrt(0.5) + 1e-4
    close(grpo_advantages(rewards[:4], 2), [-0.5 / s2, 0.5 / s2, -0.5 / s2, 0.5 / s2])


def test_grpo_nan_rewards_left_out() -> None:
    # [1, NaN, 3]: the NaN is unscorable; stats over [1, 3]: mean 2, unbiased std sqrt(2).
    std = math.sqrt(2) + 1e-4
    close(grpo_advantages(torch.tensor([1.0, float("nan"), 3.0]), 3), [-1 / std, 0.0, 1 / std])
    # A group of one scored sample has no spread: advantage 0 whatever the scaling.
    close(grpo_advantages(torch.tensor([5.0, float("nan")]), 2), [0.0, 0.0])


def test_grpo_matches_trl() -> None:
    from trl.trainer.utils import nanstd

    generator = torch.Generator().manual_seed(0)
    rewards = torch.randn(6 * 8, generator=generator)
    rewards[[3, 17, 40]] = float("nan")
    # TRL's GRPOTrainer, scale_rewards="group" (grpo_trainer.py, sum_then_normalize):
    grouped = rewards.view(-1, 8)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(8)
    std = nanstd(grouped, dim=1).repeat_interleave(8)
    expected = (rewards - mean) / (std + 1e-4)
    expected[torch.isnan(rewards)] = 0.0  # TRL forces unscorable advantages to 0
    torch.testing.assert_close(grpo_advantages(rewards, 8), expected)
    expected_unscaled = torch.nan_to_num(rewards - mean, nan=0.0)
    torch.testing.assert_close(grpo_advantages(rewards, 8, scale=False), expected_unscaled)


def test_grpo_errors() -> None:
    with pytest.raises(ValueError, match="groups of 4"):
        grpo_advantages(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="1-D"):
        grpo_advantages(torch.zeros(2, 4), 4)


# --------------------------------------------------------------------------- TRLOO
def test_trloo_single_turn_hand_computed() -> None:
    rewards = torch.tensor([[[1.0], [2.0], [3.0], [6.0]]])  # G=1, K=4, T=1
    valid = torch.ones_like(rewards, dtype=torch.bool)
    # baseline of k = mean of the other three:
    # k0: (2+3+6)/3 = 11/3 -> 1 - 11/3 = -8/3;  k1: (1+3+6)/3 = 10/3 -> 2 - 10/3 = -4/3
    # k2: (1+2+6)/3 = 3    -> 0;                k3: (1+2+3)/3 = 2     -> 6 - 2 = 4
    close(trloo_advantages(rewards, valid), [[[-8 / 3], [-4 / 3], [0.0], [4.0]]])


def test_trloo_equals_rescaled_unscaled_grpo_when_all_valid() -> None:
    # r_k - mean_{j != k} r_j = K/(K-1) * (r_k - mean_j r_j): GRPO's own-inclusive mean shrinks
    # every advantage by (K-1)/K.
    rewards = torch.randn(3, 5, 1, generator=torch.Generator().manual_seed(1))
    valid = torch.ones_like(rewards, dtype=torch.bool)
    expected = 5 / 4 * grpo_advantages(rewards.view(-1), 5, scale=False)
    torch.testing.assert_close(trloo_advantages(rewards, valid).view(-1), expected)


def multi_turn_batch() -> tuple[torch.Tensor, torch.Tensor]:
    nan = float("nan")
    rewards = torch.tensor(
        [
            # group 0, turns 0..2
            [
                [0.1, 1.0, 2.0],  # sample 0: all three turns
                [0.5, 1.5, nan],  # sample 1: stopped after turn 1 (turn 2 never reached)
                [9.0, 9.0, 9.0],  # sample 2: failed/truncated -> excluded everywhere
            ],
            # group 1: single-turn episodes
            [
                [3.0, nan, nan],
                [0.0, nan, nan],
                [0.0, nan, nan],
            ],
        ]
    )
    valid = torch.tensor(
        [
            [[T, T, T], [T, T, F], [F, F, F]],
            [[T, F, F], [T, F, F], [T, F, F]],
        ]
    )
    return rewards, valid


def test_trloo_failed_and_truncated_samples() -> None:
    rewards, valid = multi_turn_batch()
    # Group 0, turn 0: valid samples 0 and 1 -> each one's baseline is the other's reward:
    #   s0: 0.1 - 0.5 = -0.4;  s1: 0.5 - 0.1 = 0.4;  s2 excluded (its 9.0 never enters) -> 0
    # Group 0, turn 1: s0: 1.0 - 1.5 = -0.5;  s1: 1.5 - 1.0 = 0.5
    # Group 0, turn 2: only s0 valid -> no other sample, no baseline -> 0
    # Group 1, turn 0: s0: 3 - (0+0)/2 = 3;  s1: 0 - (3+0)/2 = -1.5;  s2: -1.5
    # Groups never mix: group 1's 3.0 is in no baseline of group 0.
    expected = [
        [[-0.4, -0.5, 0.0], [0.4, 0.5, 0.0], [0.0, 0.0, 0.0]],
        [[3.0, 0.0, 0.0], [-1.5, 0.0, 0.0], [-1.5, 0.0, 0.0]],
    ]
    close(trloo_advantages(rewards, valid), expected)


def test_trloo_own_reward_never_in_own_baseline() -> None:
    rewards, valid = multi_turn_batch()
    before = trloo_advantages(rewards, valid)
    baseline_before = rewards - before
    bumped = rewards.clone()
    bumped[1, 1, 0] += 10.0  # group 1, sample 1, turn 0: 0 -> 10
    after = trloo_advantages(bumped, valid)
    baseline_after = bumped - after
    # Its own baseline (1.5) is unchanged; its advantage moves by the full +10.
    assert baseline_after[1, 1, 0] == pytest.approx(baseline_before[1, 1, 0].item())
    assert after[1, 1, 0] - before[1, 1, 0] == pytest.approx(10.0)
    # The other two valid samples of that group/turn see it in their baseline: +10/2 each.
    assert (baseline_after[1, [0, 2], 0] - baseline_before[1, [0, 2], 0]).tolist() == pytest.approx(
        [5.0, 5.0]
    )
    # Nothing else moves.
    untouched = torch.ones_like(valid)
    untouched[1, :, 0] = False
    torch.testing.assert_close(after[untouched], before[untouched])


def test_trloo_invalid_rewards_do_not_matter() -> None:
    rewards, valid = multi_turn_batch()
    scrambled = torch.where(valid, rewards, torch.full_like(rewards, -1e6))
    torch.testing.assert_close(trloo_advantages(scrambled, valid), trloo_advantages(rewards, valid))


def test_trloo_errors() -> None:
    rewards, valid = multi_turn_batch()
    with pytest.raises(ValueError, match="NaN"):
        trloo_advantages(rewards, torch.ones_like(valid))
    with pytest.raises(TypeError, match="bool"):
        trloo_advantages(rewards, valid.float())
    with pytest.raises(ValueError, match="shape"):
        trloo_advantages(rewards, valid[:, :, :2])
    with pytest.raises(ValueError, match=r"\[G, K, T\]"):
        trloo_advantages(rewards[0], valid[0])


# --------------------------------------------------------------------------- turn returns
def test_turn_returns_own() -> None:
    rewards, valid = multi_turn_batch()
    own = turn_returns(rewards, valid, "own")
    close(own[0], [[0.1, 1.0, 2.0], [0.5, 1.5, 0.0], [0.0, 0.0, 0.0]])
    close(own[1], [[3.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])


def test_turn_returns_discounted() -> None:
    rewards, valid = multi_turn_batch()
    returns = turn_returns(rewards, valid, "discounted", gamma=0.5)
    # s0: R2 = 2.0;  R1 = 1.0 + 0.5 * 2.0 = 2.0;  R0 = 0.1 + 0.5 * 2.0 = 1.1
    # s1: R2 = 0 (not reached);  R1 = 1.5;  R0 = 0.5 + 0.5 * 1.5 = 1.25
    # s2: excluded -> 0 everywhere
    close(returns[0], [[1.1, 2.0, 2.0], [1.25, 1.5, 0.0], [0.0, 0.0, 0.0]])
    close(returns[1], [[3.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    # gamma 0 is the own reward; gamma 1 the plain sum of the turn and later ones.
    torch.testing.assert_close(
        turn_returns(rewards, valid, "discounted", 0.0), turn_returns(rewards, valid)
    )
    close(turn_returns(rewards, valid, "discounted", 1.0)[0, 0], [3.1, 3.0, 2.0])


def test_turn_returns_gap_counts_in_discount() -> None:
    rewards = torch.tensor([[[1.0, 5.0, 4.0]]])
    valid = torch.tensor([[[T, F, T]]])
    # R2 = 4;  R1 = 0 (invalid, and its 5.0 is never counted);  R0 = 1 + 0.5 * 0 + 0.25 * 4 = 2
    close(turn_returns(rewards, valid, "discounted", 0.5), [[[2.0, 0.0, 4.0]]])


def test_trloo_on_discounted_returns() -> None:
    rewards, valid = multi_turn_batch()
    advantages = trloo_advantages(turn_returns(rewards, valid, "discounted", 0.5), valid)
    # Group 0 returns: s0 [1.1, 2.0, 2.0], s1 [1.25, 1.5, -]
    # turn 0: s0 1.1 - 1.25 = -0.15, s1 +0.15;  turn 1: s0 2.0 - 1.5 = 0.5, s1 -0.5;  turn 2: 0
    close(advantages[0], [[-0.15, 0.5, 0.0], [0.15, -0.5, 0.0], [0.0, 0.0, 0.0]])


def test_turn_returns_errors() -> None:
    rewards, valid = multi_turn_batch()
    with pytest.raises(ValueError, match="mode"):
        turn_returns(rewards, valid, "monte_carlo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gamma"):
        turn_returns(rewards, valid, "discounted", gamma=1.5)


# --------------------------------------------------------------------------- flat and ragged
def test_leave_one_out_flat_layout() -> None:
    close(
        leave_one_out_advantages(torch.tensor([1.0, 2.0, 3.0, 6.0]), 4), [-8 / 3, -4 / 3, 0.0, 4.0]
    )
    # [1, NaN, 3, 5]: the NaN is invalid; others: 1 - (3+5)/2 = -3, 3 - (1+5)/2 = 0, 5 - 2 = 3.
    rewards = torch.tensor([1.0, float("nan"), 3.0, 5.0, 7.0, 1.0])
    close(leave_one_out_advantages(rewards[:4], 4), [-3.0, 0.0, 0.0, 3.0])
    # Groups of 2 with the last sample excluded: [1, NaN] -> no other valid -> 0, 0;
    # [3, 5] -> -2, 2; [7, 1 excluded] -> 0, 0.
    valid = torch.tensor([T, T, T, T, T, F])
    close(leave_one_out_advantages(rewards, 2, valid), [0.0, 0.0, -2.0, 2.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="groups of 4"):
        leave_one_out_advantages(rewards, 4)


def test_pack_and_unpack_turns() -> None:
    samples = [[0.1, 1.0, 2.0], [0.5, 1.5], None, [3.0], [0.0], [0.0]]
    rewards, valid = pack_turns(samples, group_size=3)
    expected_rewards, expected_valid = multi_turn_batch()
    assert torch.equal(valid, expected_valid)
    torch.testing.assert_close(rewards, torch.where(valid, expected_rewards, torch.zeros(())))
    advantages = unpack_turns(trloo_advantages(rewards, valid), valid)
    expected = [[-0.4, -0.5, 0.0], [0.4, 0.5], [], [3.0], [-1.5], [-1.5]]
    for got, want in zip(advantages, expected, strict=True):
        assert got == pytest.approx(want)
    padded, padded_valid = pack_turns(samples, group_size=3, max_turns=4)
    assert padded.shape == (2, 3, 4) and not padded_valid[..., 3].any()
    with pytest.raises(ValueError, match="max_turns"):
        pack_turns(samples, group_size=3, max_turns=2)
    with pytest.raises(ValueError, match="groups of 4"):
        pack_turns(samples, group_size=4)


# --------------------------------------------------------------------------- unscored samples
# A harness_error (kernelrl's failure, not the solution's) has no reward: NaN / None, never 0.
NAN = float("nan")


def test_grpo_group_of_four_with_one_unscored_sample() -> None:
    # [2, unscored, 0, 4]: a group of 3 for the statistics: mean 2, deviations [0, -2, 2],
    # unbiased var (0 + 4 + 4) / 2 = 4, std 2. Scoring the unscored one 0 instead would give
    # mean 1.5 and a negative advantage to a sample that was never judged.
    rewards = torch.tensor([2.0, NAN, 0.0, 4.0])
    s = 2.0 + 1e-4
    close(grpo_advantages(rewards, 4), [0.0, 0.0, -2 / s, 2 / s])
    close(grpo_advantages(rewards, 4, scale=False), [0.0, 0.0, -2.0, 2.0])


def test_entirely_unscored_group_gets_zero_advantages_and_no_nan() -> None:
    # Group 0 scored normally, group 1 all unscored (the harness was down for that prompt).
    rewards = torch.tensor([1.0, 3.0, 1.0, 3.0, NAN, NAN, NAN, NAN])
    s = math.sqrt(4 / 3) + 1e-4  # deviations [-1, 1, -1, 1], unbiased var 4/3
    for scale, expected in ((True, [-1 / s, 1 / s, -1 / s, 1 / s]), (False, [-1, 1, -1, 1])):
        advantages = grpo_advantages(rewards, 4, scale=scale)
        assert not torch.isnan(advantages).any()
        close(advantages, expected + [0.0] * 4)
    loo = leave_one_out_advantages(rewards, 4)
    assert not torch.isnan(loo).any()
    # k0: 1 - (3+1+3)/3 = -4/3; k1: 3 - (1+1+3)/3 = 4/3
    close(loo, [-4 / 3, 4 / 3, -4 / 3, 4 / 3, 0.0, 0.0, 0.0, 0.0])
    grid, valid = pack_turns([[NAN], [None], [NAN], [None]], group_size=4)
    assert not valid.any()
    out = trloo_advantages(grid, valid)
    assert not torch.isnan(out).any() and not out.any()
    returns = turn_returns(grid, valid, "discounted", 0.9)
    assert not torch.isnan(returns).any() and not returns.any()


def test_trloo_unscored_turn_leaves_the_baseline_of_that_turn_only() -> None:
    # One prompt, 4 samples, 2 turns. Sample 1's turn 0 was a harness_error (unscored) but its
    # turn 1 was evaluated; sample 3 stopped after turn 0 (correct).
    samples = [[1.0, 2.0], [None, 4.0], [3.0, 0.0], [5.0]]
    rewards, valid = pack_turns(samples, group_size=4)
    assert valid.tolist() == [[[T, T], [F, T], [T, T], [T, F]]]
    assert not torch.isnan(rewards).any()
    # Turn 0: scored samples 0, 2, 3 (sample 1 is out of every baseline):
    #   s0: 1 - (3+5)/2 = -3;  s2: 3 - (1+5)/2 = 0;  s3: 5 - (1+3)/2 = 3;  s1: 0 (unscored)
    # Turn 1: scored samples 0, 1, 2:
    #   s0: 2 - (4+0)/2 = 0;  s1: 4 - (2+0)/2 = 3;  s2: 0 - (2+4)/2 = -3;  s3: not reached
    close(trloo_advantages(rewards, valid), [[[-3.0, 0.0], [0.0, 3.0], [0.0, -3.0], [3.0, 0.0]]])
    # GRPO per turn, as the trainer does it (unscored -> NaN): turn 0 over [1, 3, 5]:
    # mean 3, deviations [-2, 0, 2], unbiased std 2.
    turn0 = torch.where(valid[0, :, 0], rewards[0, :, 0], torch.nan)
    s = 2.0 + 1e-4
    close(grpo_advantages(turn0, 4), [-2 / s, 0.0, 0.0, 2 / s])
    # Discounted returns: the unscored turn 0 of sample 1 returns 0 (invalid), its turn 1 its own.
    returns = turn_returns(rewards, valid, "discounted", 0.5)
    close(returns, [[[1.0 + 0.5 * 2.0, 2.0], [0.0, 4.0], [3.0, 0.0], [5.0, 0.0]]])


# --------------------------------------------------------------------------- Dr. Kernel's TRLOO
def _grid(samples: list, group_size: int, turns: int) -> tuple[torch.Tensor, ...]:
    """(rewards, reached, valid) from per-sample turn rewards; None = an unscored turn."""
    n = len(samples)
    rewards = torch.zeros(n, turns)
    reached = torch.zeros(n, turns, dtype=torch.bool)
    valid = torch.zeros(n, turns, dtype=torch.bool)
    for i, sample in enumerate(samples):
        for t, r in enumerate(sample):
            reached[i, t] = True
            if r is not None:
                rewards[i, t], valid[i, t] = r, True
    shape = (n // group_size, group_size, turns)
    return rewards.view(shape), reached.view(shape), valid.view(shape)


def test_drkernel_trloo_unequal_turns_failed_turn_and_gamma() -> None:
    # One prompt, 3 samples reaching 3, 1 and 2 turns; sample 0's first turn failed (reward 0,
    # a sample like any other), gamma 0.5. Returns G_t = r_t + 0.5 G_{t+1}:
    #   s0: G2 = 2, G1 = 1 + 0.5*2 = 2, G0 = 0 + 0.5*2 = 1;  s1: G0 = 1;  s2: G1 = 3, G0 = 1.5.
    rewards, reached, valid = _grid([[0.0, 1.0, 2.0], [1.0], [0.0, 3.0]], 3, 3)
    advantages, included = drkernel_trloo_advantages(rewards, reached, valid, gamma=0.5)
    # Turn 0 over [1, 1, 1.5]: s0 1 - (1 + 1.5)/2 = -0.25; s1 -0.25; s2 1.5 - (1 + 1)/2 = 0.5.
    # Turn 1 over s0 (2) and s2 (3): -1 and +1. Turn 2: s0 alone keeps its return 2.
    close(advantages, [[[-0.25, -1.0, 2.0], [-0.25, 0.0, 0.0], [0.5, 1.0, 0.0]]])
    assert included.tolist() == reached.tolist()
    # Ours on the same discounted returns differs only where s0 is alone (no baseline -> 0).
    ours = trloo_advantages(turn_returns(rewards, valid, "discounted", 0.5), valid)
    close(ours, [[[-0.25, -1.0, 0.0], [-0.25, 0.0, 0.0], [0.5, 1.0, 0.0]]])


def test_drkernel_trloo_gamma_one_is_their_recipe() -> None:
    # gamma 1: s0 G = [3, 3, 2]; s1 [1]; s2 [3, 3].
    rewards, reached, valid = _grid([[0.0, 1.0, 2.0], [1.0], [0.0, 3.0]], 3, 3)
    advantages, _ = drkernel_trloo_advantages(rewards, reached, valid)
    # Turn 0 over [3, 1, 3]: 3 - 2 = 1, 1 - 3 = -2, 1. Turn 1: 3 - 3 = 0 twice. Turn 2: 2.
    close(advantages, [[[1.0, 0.0, 2.0], [-2.0, 0.0, 0.0], [1.0, 0.0, 0.0]]])


def test_drkernel_trloo_groups_of_one_and_two() -> None:
    # A group of one has no other sample: its return is its advantage (ours: 0).
    rewards, reached, valid = _grid([[2.0, 1.0]], 1, 2)
    advantages, _ = drkernel_trloo_advantages(rewards, reached, valid)
    close(advantages, [[[3.0, 1.0]]])  # G0 = 2 + 1, G1 = 1
    close(trloo_advantages(turn_returns(rewards, valid, "discounted", 1.0), valid), [[[0.0, 0.0]]])
    # Groups of two: each sample's baseline is the other's return. Group 2: s1 stopped early.
    rewards, reached, valid = _grid([[1.0], [0.0], [0.5, 1.0], [2.0]], 2, 2)
    advantages, _ = drkernel_trloo_advantages(rewards, reached, valid)
    # Group 1: [1, -1]. Group 2, turn 0: G = [1.5, 2] -> -0.5, 0.5; turn 1: s0 alone -> 1.
    close(advantages, [[[1.0, 0.0], [-1.0, 0.0]], [[-0.5, 1.0], [0.5, 0.0]]])


def test_drkernel_trloo_unscored_turn_removes_the_returns_that_sum_it() -> None:
    # s0's second turn is a harness_error (unscored; it ends the rollout): its turn-0 return
    # would sum an unknown reward, so s0 leaves every baseline (Dr. Kernel masks a failed
    # rollout); s1 and s2 compare with each other only.
    rewards, reached, valid = _grid([[1.0, None], [2.0], [0.0, 1.0]], 3, 2)
    advantages, included = drkernel_trloo_advantages(rewards, reached, valid)
    # Turn 0 over s1 (2) and s2 (0 + 1 = 1): +1, -1. Turn 1: s2 alone -> its return 1.
    close(advantages, [[[0.0, 0.0], [1.0, 0.0], [-1.0, 1.0]]])
    assert included.tolist() == [[[F, F], [T, F], [T, T]]]
    # A scored turn after an unscored one (not produced by our rollout) keeps a known return.
    rewards, reached, valid = _grid([[None, 2.0], [0.0, 1.0]], 2, 2)
    advantages, included = drkernel_trloo_advantages(rewards, reached, valid)
    assert included.tolist() == [[[F, T], [T, T]]]
    # Turn 0: s1 alone keeps its return 0 + 1 = 1. Turn 1: s0 2 - 1 = 1, s1 1 - 2 = -1.
    close(advantages, [[[0.0, 1.0], [1.0, -1.0]]])


def _kernelgym_reference(rewards, reached, valid, gamma):  # noqa: ANN001, ANN202
    """Dr. Kernel's estimator written in its own flat form: rows (sample, turn) with a uid per
    prompt and a turn index (-1 for padding turns), a per-row mask, returns over the padded
    turn grid, then (uid, turn) groups: A = G * n/(n-1) - mean * n/(n-1), or G when n = 1."""
    groups, size, turns = rewards.shape
    flat_r = rewards.reshape(-1, turns)
    returns = torch.zeros_like(flat_r)
    for t in reversed(range(turns)):
        nxt = returns[:, t + 1] if t + 1 < turns else 0.0
        returns[:, t] = torch.where(valid.reshape(-1, turns)[:, t], flat_r[:, t], 0.0) + gamma * nxt
    rows = []
    for i in range(groups * size):
        failed = bool((reached.reshape(-1, turns)[i] & ~valid.reshape(-1, turns)[i]).any())
        for t in range(turns):
            turn_index = t if reached.reshape(-1, turns)[i, t] else -1
            rows.append((i // size, turn_index, not failed, returns[i, t].item()))
    by_key: dict = {}
    for uid, turn_index, mask, ret in rows:
        if turn_index != -1 and mask:
            by_key.setdefault((uid, turn_index), []).append(ret)
    out = []
    for uid, turn_index, mask, ret in rows:
        if turn_index == -1 or not mask:
            out.append(0.0)
            continue
        values = by_key[(uid, turn_index)]
        n = len(values)
        mean = sum(values) / n
        out.append(ret * n / (n - 1) - mean * n / (n - 1) if n > 1 else ret)
    return torch.tensor(out).view(groups, size, turns)


@pytest.mark.parametrize("gamma", [1.0, 0.7])
def test_drkernel_trloo_matches_kernelgym_form_on_random_batches(gamma: float) -> None:
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        groups, size, turns = 3, int(torch.randint(1, 6, (1,), generator=generator)), 3
        lengths = torch.randint(1, turns + 1, (groups * size,), generator=generator)
        samples = []
        for length in lengths.tolist():
            sample = [round(float(x), 2) for x in torch.rand(length, generator=generator) * 3]
            if torch.rand(1, generator=generator).item() < 0.15:
                sample[-1] = None  # an unscored last turn: ends the rollout
            samples.append(sample)
        rewards, reached, valid = _grid(samples, size, turns)
        advantages, _ = drkernel_trloo_advantages(rewards, reached, valid, gamma)
        expected = _kernelgym_reference(rewards, reached, valid, gamma)
        torch.testing.assert_close(advantages, expected, rtol=1e-5, atol=1e-5)


def test_drkernel_trloo_errors() -> None:
    rewards, reached, valid = _grid([[1.0], [2.0]], 2, 1)
    with pytest.raises(ValueError, match="reached"):
        drkernel_trloo_advantages(rewards, reached.float(), valid)
    with pytest.raises(ValueError, match="reached turn"):
        drkernel_trloo_advantages(rewards, torch.zeros_like(reached), valid)
    with pytest.raises(ValueError, match="gamma"):
        drkernel_trloo_advantages(rewards, reached, valid, gamma=1.5)
