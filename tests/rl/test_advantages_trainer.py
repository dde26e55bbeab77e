"""The trainer's own reward and advantage code on hand-built rollouts: unscored turns (a
harness_error) leave the loss and every baseline, and Dr. Kernel's TRLOO and rejection as the
trainer applies them."""

from __future__ import annotations

import math

import pytest
import torch


def _trainer_for_scoring(advantage: str, rejection_preset: str = "kernelrl"):  # noqa: ANN202
    """The trainer's own reward and advantage code (``_calculate_rewards``,
    ``_apply_advantages``) on hand-built rollouts: only the state they read, no model."""
    import collections
    from types import SimpleNamespace

    from accelerate import Accelerator

    from kernelrl.rewards import build_reward_funcs
    from kernelrl.rl.rejection import RejectionSampling
    from kernelrl.rl.trainer import KernelGRPOTrainer

    trainer = object.__new__(KernelGRPOTrainer)
    funcs, weights = build_reward_funcs()
    trainer.accelerator = Accelerator(cpu=True)
    trainer.args = SimpleNamespace(
        max_turns=2, turn_return="own", turn_gamma=1.0, advantage=advantage,
        scale_rewards="group", report_to=[], seed=0, save_rollouts=False,
        rejection=RejectionSampling(rejection_preset=rejection_preset),
    )  # fmt: skip
    trainer.reward_funcs, trainer.reward_func_names = funcs, [f.__name__ for f in funcs]
    trainer.reward_weights = torch.tensor(weights)
    trainer.num_generations = trainer.num_generations_eval = 4
    trainer.pad_to_multiple_of = None
    trainer.model = SimpleNamespace(training=True)
    trainer.state = SimpleNamespace(global_step=0)
    trainer._metrics = {"train": collections.defaultdict(list)}
    trainer._log_metric = lambda name, value: None
    trainer.asynchronous = None  # the synchronous trainer
    return trainer


def _in_flight(inputs: list, batch: object):  # noqa: ANN202 - BatchInFlight
    """What ``score_batch`` hands TRL's hooks: the inputs and their (already run) rollout."""
    from kernelrl.rl.trainer import BatchInFlight

    return BatchInFlight(inputs, batch)


def _rollouts():  # noqa: ANN202 - (trajectories, RolloutBatch)
    from kernelrl.env.result import EvalResult, Status
    from kernelrl.env.task import Task
    from kernelrl.rl.rollout import RolloutStats, Trajectory, Turn
    from kernelrl.rl.steps import RolloutBatch

    def evaluated(status: Status) -> EvalResult:
        # CPU results: correct = 0.1 + 1 + 0.5 (profiling fallback) = 1.6; failures 0.1.
        return EvalResult("t", "triton", status, device="cpu", custom_kernel_launches=1)

    task = Task("t", "src")
    plans = [  # statuses of each sample's turns (the rollout stops after a harness_error)
        [Status.INCORRECT, Status.CORRECT],
        [Status.HARNESS_ERROR],
        [Status.CORRECT],
        [Status.COMPILE_ERROR, Status.HARNESS_ERROR],
    ]
    trajectories = []
    for plan in plans:
        trajectory = Trajectory(task=task, prompt_ids=[1])
        for t, status in enumerate(plan):
            if t:
                trajectory._append([9], None, -1)  # feedback tokens
            trajectory._append([5, 6], None, t)
            trajectory.turns.append(Turn([5, 6], "code", False, evaluated(status)))
        trajectories.append(trajectory)
    return trajectories, RolloutBatch(("k",), trajectories, RolloutStats())


@pytest.mark.parametrize("advantage", ["trloo", "grpo"])
def test_trainer_leaves_harness_error_turns_unscored(advantage: str) -> None:
    trainer = _trainer_for_scoring(advantage)
    trajectories, batch = _rollouts()
    inputs = [{"prompt": "p", "kernelrl_rollout": t} for t in trajectories]
    trainer._in_flight = flight = _in_flight(inputs, batch)
    last = trainer._calculate_rewards(inputs, ["p"] * 4, ["c"] * 4, [[5, 6]] * 4)
    # TRL gets the last turn's components: NaN rows (all functions returned None) for the
    # samples whose last turn is unscored, which TRL itself treats as unscorable.
    assert torch.isnan(last[1]).all() and torch.isnan(last[3]).all()
    assert not torch.isnan(last[0]).any() and not torch.isnan(last[2]).any()
    turn_rewards = flight.turns.components
    assert torch.isnan(turn_rewards[1, 0]).all() and torch.isnan(turn_rewards[3, 1]).all()

    width = max(len(t.completion_ids) for t in trajectories)
    output = {
        "completion_ids": torch.zeros(4, width, dtype=torch.long),
        "tool_mask": torch.ones(4, width, dtype=torch.long),
    }
    trainer._apply_advantages(output, flight, "train")
    # Turn rewards: s0 [0.1, 1.6], s1 [unscored], s2 [1.6], s3 [0.1, unscored].
    if advantage == "trloo":
        # Turn 0 over s0, s2, s3: s0 0.1 - (1.6 + 0.1)/2 = -0.75; s2 1.6 - 0.1 = 1.5; s3 -0.75.
        # Turn 1: s0 is the only scored sample (s3's unscored turn is no baseline of 0): 0.
        a0 = [-0.75, 0.0, 1.5, -0.75]
    else:
        # Turn 0 over [0.1, 1.6, 0.1]: mean 0.6, unbiased std sqrt(0.75).
        s = math.sqrt(0.75) + 1e-4
        a0 = [-0.5 / s, 0.0, 1.0 / s, -0.5 / s]
    advantages = output["advantages"]
    assert not torch.isnan(advantages).any()
    # Token layout: s0 [t0, t0, fb, t1, t1]; s1 [t0, t0]; s2 [t0, t0]; s3 [t0, t0, fb, t1, t1].
    expected = [
        [a0[0], a0[0], 0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0, 0.0],
        [a0[2], a0[2], 0.0, 0.0, 0.0],
        [a0[3], a0[3], 0.0, 0.0, 0.0],
    ]
    torch.testing.assert_close(advantages, torch.tensor(expected), rtol=1e-5, atol=1e-5)
    # Tokens of unscored turns leave the loss: s1's only turn, s3's second turn.
    assert output["tool_mask"].tolist() == [
        [1, 1, 1, 1, 1],
        [0, 0, 1, 1, 1],
        [1, 1, 1, 1, 1],
        [1, 1, 1, 0, 0],
    ]
    metrics = trainer._metrics["train"]
    assert metrics["env/harness_error_frac"] == [pytest.approx(2 / 6)]
    assert metrics["env/unscored_turn_frac"] == [pytest.approx(2 / 6)]
    assert metrics["rejection/rate"] == [0.0]  # a harness_error is not a rejected failure


def test_trainer_drkernel_trloo_on_rollouts_with_harness_errors() -> None:
    trainer = _trainer_for_scoring("drkernel_trloo", rejection_preset="drkernel")
    trajectories, batch = _rollouts()
    inputs = [{"prompt": "p", "kernelrl_rollout": t} for t in trajectories]
    trainer._in_flight = flight = _in_flight(inputs, batch)
    trainer._calculate_rewards(inputs, ["p"] * 4, ["c"] * 4, [[5, 6]] * 4)
    width = max(len(t.completion_ids) for t in trajectories)
    output = {
        "completion_ids": torch.zeros(4, width, dtype=torch.long),
        "tool_mask": torch.ones(4, width, dtype=torch.long),
    }
    trainer._apply_advantages(output, flight, "train")
    # Turn rewards: s0 [0.1, 1.6], s1 [unscored], s2 [1.6], s3 [0.1, unscored]. s1 and s3 have
    # an unscored turn: out of every baseline. Returns (gamma 1): s0 [1.7, 1.6], s2 [1.6].
    # Turn 0: s0 1.7 - 1.6 = 0.1, s2 -0.1. Turn 1: s0 alone keeps its return 1.6.
    expected = [
        [0.1, 0.1, 0.0, 1.6, 1.6],
        [0.0, 0.0, 0.0, 0.0, 0.0],
        [-0.1, -0.1, 0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0, 0.0],
    ]
    torch.testing.assert_close(output["advantages"], torch.tensor(expected), rtol=1e-5, atol=1e-5)
    # s1's turn and both of s3's leave the loss (s3's first turn has an unknown return).
    assert output["tool_mask"].tolist() == [
        [1, 1, 1, 1, 1],
        [0, 0, 1, 1, 1],
        [1, 1, 1, 1, 1],
        [0, 0, 1, 0, 0],
    ]


@pytest.mark.parametrize("advantage", ["drkernel_trloo", "trloo"])
def test_trainer_drkernel_prs_rejected_turn_stays_in_their_baseline(advantage: str) -> None:
    from kernelrl.env.result import EvalResult, Status
    from kernelrl.env.task import Task
    from kernelrl.rl.rollout import RolloutStats, Trajectory, Turn
    from kernelrl.rl.steps import RolloutBatch

    trainer = _trainer_for_scoring(advantage, rejection_preset="drkernel")
    trajectories = []
    for share in (0.9, 0.1, 0.9, 0.9):  # sample 1 is correct but lazy: keep probability 0
        trajectory = Trajectory(task=Task("t", "src"), prompt_ids=[1])
        trajectory._append([5, 6], None, 0)
        result = EvalResult(
            "t", "triton", Status.CORRECT, device="cuda", own_kernel_share=share,
            custom_kernel_launches=1, timing_meaningful=True, speedup_vs_eager=1.0,
        )  # fmt: skip
        trajectory.turns.append(Turn([5, 6], "code", False, result))
        trajectories.append(trajectory)
    batch = RolloutBatch(("k",), trajectories, RolloutStats())
    inputs = [{"prompt": "p", "kernelrl_rollout": t} for t in trajectories]
    trainer._in_flight = flight = _in_flight(inputs, batch)
    trainer._calculate_rewards(inputs, ["p"] * 4, ["c"] * 4, [[5, 6]] * 4)
    output = {
        "completion_ids": torch.zeros(4, 2, dtype=torch.long),
        "tool_mask": torch.ones(4, 2, dtype=torch.long),
    }
    trainer._apply_advantages(output, flight, "train")
    # Rewards (kernelrl weights, speed-up 1: log2 term 0): 0.1 + 1 + 0.5 * share -> 1.55, 1.15.
    # Dr. Kernel: the rejected sample stays in the others' baselines; ours: it leaves them,
    # and the other three are equal.
    a = 1.55 - (1.15 + 1.55 + 1.55) / 3 if advantage == "drkernel_trloo" else 0.0
    expected = [[a, a], [0.0, 0.0], [a, a], [a, a]]
    torch.testing.assert_close(output["advantages"], torch.tensor(expected), rtol=1e-5, atol=1e-5)
    # Its tokens leave the loss (their PRS masks the response tokens of a rejected turn).
    assert output["tool_mask"].tolist() == [[1, 1], [0, 0], [1, 1], [1, 1]]
    assert trainer._metrics["train"]["rejection/rate"] == [pytest.approx(0.25)]
