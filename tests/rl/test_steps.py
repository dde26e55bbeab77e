"""kernelrl.rl.steps without a trainer: each step of rollout -> rewards -> advantages -> TRL's
batch on hand-built trajectories, against hand-computed values."""

from __future__ import annotations

import pytest
import torch

from kernelrl.env.gpu_claim import SHARING_UNKNOWN_KEY
from kernelrl.env.result import EvalResult, Status
from kernelrl.env.task import Task
from kernelrl.rewards import build_reward_funcs
from kernelrl.rl import steps
from kernelrl.rl.rejection import DrKernelRejectionConfig, RejectionConfig, rejection_weights
from kernelrl.rl.rollout import Trajectory, Turn

NAN = float("nan")


def trajectory(*statuses: Status, share: float | None = None) -> Trajectory:
    """Turns of two tokens each, one feedback token between turns."""
    out = Trajectory(task=Task("t", "src"), prompt_ids=[1])
    for t, status in enumerate(statuses):
        if t:
            out._append([9], None, -1)
        out._append([5, 6], None, t)
        result = EvalResult(
            "t", "triton", status, device="cpu", custom_kernel_launches=1, own_kernel_share=share
        )
        out.turns.append(Turn([5, 6], f"code{t}", False, result))
    return out


def by_status(k: int, kwargs: dict) -> list[float | None]:
    """Component k: 1 for a correct result, 0 otherwise; component 1 says None for turn 1."""
    if k == 1 and kwargs["turn"] == 1:
        return [None] * len(kwargs["eval_results"])
    return [float(r.status == Status.CORRECT) for r in kwargs["eval_results"]]


def test_score_turns_calls_each_function_per_turn_in_trls_form() -> None:
    trajectories = [
        trajectory(Status.INCORRECT, Status.CORRECT),
        trajectory(Status.HARNESS_ERROR),
        trajectory(Status.CORRECT),
    ]
    rows = [{"prompt": "p", "id": i, "kernelrl_rollout": t} for i, t in enumerate(trajectories)]
    seen: list[dict] = []

    def call(k: int, kwargs: dict) -> list[float | None]:
        seen.append(kwargs)
        return by_status(k, kwargs)

    per_turn = steps.score_turns(trajectories, rows, ["p"] * 3, ["a", "b"], call, 3, {"x": 1})
    assert per_turn.shape == (3, 3, 2)
    # sample 1's only turn is a harness_error: NaN whatever the function said; turn 2 unreached
    expected = [[[0, 0], [1, NAN], [NAN, NAN]], [[NAN] * 2] * 3, [[1, 1], [NAN] * 2, [NAN] * 2]]
    torch.testing.assert_close(per_turn, torch.tensor(expected), equal_nan=True)
    first = seen[0]
    assert first["completions"] == ["code0"] * 3 and first["id"] == [0, 1, 2]
    assert first["x"] == 1 and first["turn"] == 0 and "kernelrl_rollout" not in first
    assert seen[2]["completion_ids"] == [[5, 6]] and seen[2]["turn"] == 1  # only sample 0
    # chat prompts get chat completions
    chat = steps.score_turns(trajectories[:1], rows[:1], [[{"role": "user"}]], ["a"], call, 1)
    assert seen[-1]["completions"] == [[{"role": "assistant", "content": "code0"}]]
    assert chat.shape == (1, 1, 1)
    with pytest.raises(ValueError, match="returned 1 values for 3"):
        steps.score_turns(trajectories, rows, ["p"] * 3, ["a"], lambda k, kw: [1.0], 1)


def test_a_turn_whose_timing_was_left_unused_is_not_rewarded_whatever_a_function_said() -> None:
    unjudged = trajectory(Status.CORRECT)
    unjudged.turns[0].result.device = "cuda"
    unjudged.turns[0].result.sandbox[SHARING_UNKNOWN_KEY] = "the GPU was not found quiet"
    trajectories = [unjudged, trajectory(Status.CORRECT)]
    rows = [{"prompt": "p"} for _ in trajectories]
    per_turn = steps.score_turns(trajectories, rows, ["p"] * 2, ["a"], by_status, 1)
    torch.testing.assert_close(per_turn, torch.tensor([[[NAN]], [[1.0]]]), equal_nan=True)


def test_the_sequence_from_rollouts_to_trls_batch() -> None:
    # One group of four. s1 lazy (correct, own-kernel share 0.1): dropped by rejection.
    trajectories = [
        trajectory(Status.INCORRECT, Status.CORRECT, share=0.9),
        trajectory(Status.CORRECT, share=0.1),
        trajectory(Status.CORRECT, share=0.9),
        trajectory(Status.COMPILE_ERROR, Status.HARNESS_ERROR, share=0.9),
    ]
    rows = [{"prompt": "p"} for _ in trajectories]
    funcs, weights = build_reward_funcs()

    def call(k: int, kwargs: dict) -> list[float | None]:
        return funcs[k](**kwargs)

    components = steps.score_turns(trajectories, rows, ["p"] * 4, ["f"] * 5, call, 2)
    reject = steps.make_rejector(
        "kernelrl", RejectionConfig(), DrKernelRejectionConfig(), seed=(0, 0, 0)
    )
    local = steps.rewarded_turns(components, torch.tensor(weights), trajectories, reject)
    # correct: 0.1 (format) + 1 (correct) + 0.5 * share (profiling); no timing on CPU
    torch.testing.assert_close(
        local.rewards, torch.tensor([[0.1, 1.55], [1.15, 0.0], [1.55, 0.0], [0.1, 0.0]])
    )
    assert local.keep.tolist() == [[1, 1], [0, 1], [1, 1], [1, 1]]
    assert local.rejection["low_kernel_share"] == 1
    assert local.trained.tolist() == [[True, True], [False, False], [True, False], [True, False]]
    turns = local.across(lambda x: x)  # one process
    advantages = steps.turn_advantages(turns, 4, steps.AdvantageSettings("trloo"))
    # Turn 0 over s0, s2, s3 (s1 dropped): 0.1 - (1.55 + 0.1)/2 = -0.725, 1.45, -0.725.
    # Turn 1: s0 alone (s3's turn is unscored): no baseline, 0.
    torch.testing.assert_close(
        advantages.advantages,
        torch.tensor([[-0.725, 0.0], [0.0, 0.0], [1.45, 0.0], [-0.725, 0.0]]),
    )
    left_out = steps.left_out_turns(local, advantages.rows(0, 4), drop_rejected=False)
    assert left_out.tolist() == [[False, False], [False, False], [False, False], [False, True]]
    tokens = steps.token_advantages(advantages.advantages, left_out, trajectories, 6)
    output = {"tool_mask": torch.ones(4, 6, dtype=torch.long)}
    steps.into_trl_batch(output, tokens, "cpu")
    torch.testing.assert_close(
        output["advantages"][0], torch.tensor([-0.725, -0.725, 0.0, 0.0, 0.0, 0.0])
    )
    assert output["advantages"].dtype == torch.float32
    assert output["tool_mask"].tolist()[3] == [1, 1, 1, 0, 0, 1]  # s3's unscored turn 1


def test_rejection_weights_enter_the_keep_grid_turn_by_turn() -> None:
    cheat = trajectory(Status.INTEGRITY_VIOLATION, Status.CORRECT)
    keep, counts = steps.reject_turns([cheat], 3, lambda r: rejection_weights(r))
    assert keep.tolist() == [[0.0, 1.0, 1.0]] and counts["integrity"] == 1
    keep, counts = steps.reject_turns([cheat], 2, None)
    assert keep.tolist() == [[1.0, 1.0]] and not counts


def test_advantage_estimators_and_their_errors() -> None:
    components = torch.tensor([[[1.0]], [[3.0]]])
    turns = steps.RewardedTurns(
        components, torch.ones(1), torch.ones(2, 1, dtype=torch.bool), torch.ones(2, 1)
    )
    grpo = steps.turn_advantages(turns, 2, steps.AdvantageSettings("grpo", scale=False))
    torch.testing.assert_close(grpo.advantages, torch.tensor([[-1.0], [1.0]]))
    drk = steps.turn_advantages(turns, 2, steps.AdvantageSettings("drkernel_trloo"))
    torch.testing.assert_close(drk.advantages, torch.tensor([[-2.0], [2.0]]))
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        steps.turn_advantages(turns, 2, steps.AdvantageSettings("ppo"))
