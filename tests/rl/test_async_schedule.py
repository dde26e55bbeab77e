"""The arithmetic of asynchronous training: which groups a step trains (complete ones first,
none past its deadline) and the importance weights of stale tokens."""

from __future__ import annotations

import math

import pytest
import torch

from kernelrl.rl.async_schedule import ScheduleError, Slot, importance_weights, plan_step


def slots(*specs: tuple[int, int, bool]) -> list[Slot]:
    """(order, version, complete) per group; the key is the order."""
    return [Slot(order, order, version, complete) for order, version, complete in specs]


def keys(chosen: list[Slot]) -> list[object]:
    return [s.key for s in chosen]


def test_staleness_zero_trains_the_batch_of_its_step_and_waits_for_it() -> None:
    # batch 3's group (version 3) and batch 4's, queued but not started (no version yet)
    plan = plan_step(slots((3, 3, False), (4, 1 << 62, False)), step=3, count=1, max_staleness=0)
    assert keys(plan) == [3]  # due now: the step waits for it


def test_a_complete_group_goes_first_and_a_slow_one_carries_over() -> None:
    plan = plan_step(slots((0, 0, False), (1, 0, True)), step=0, count=1, max_staleness=1)
    assert keys(plan) == [1]
    # one step later the slow group is due: the step waits for it, whatever else is complete
    plan = plan_step(slots((0, 0, False), (2, 1, True)), step=1, count=1, max_staleness=1)
    assert keys(plan) == [0]


def test_groups_that_later_steps_cannot_absorb_are_forced_now() -> None:
    # staleness 2: three groups of version 0 all expire by step 2; steps 0, 1, 2 train one each
    # so none may be skipped for the complete group of version 1
    in_flight = slots((0, 0, False), (1, 0, False), (2, 0, False), (3, 1, True))
    assert keys(plan_step(in_flight, step=0, count=1, max_staleness=2)) == [0]
    # with room to spare the complete group is taken
    roomy = slots((0, 0, False), (1, 0, False), (3, 1, True))
    assert keys(plan_step(roomy, step=0, count=1, max_staleness=2)) == [3]


def test_a_missed_deadline_or_too_few_groups_is_an_error() -> None:
    with pytest.raises(ScheduleError, match="passed their last step"):
        plan_step(slots((0, 0, True), (1, 1, True)), step=2, count=1, max_staleness=1)
    with pytest.raises(ScheduleError, match="needs 2 groups"):
        plan_step(slots((0, 0, True)), step=0, count=2, max_staleness=1)
    with pytest.raises(ScheduleError, match="would have to train 2"):
        plan_step(slots((0, 0, False), (1, 0, False)), step=0, count=1, max_staleness=0)


def test_the_plan_is_in_data_order() -> None:
    plan = plan_step(slots((5, 1, True), (2, 1, True), (7, 1, False)), 1, 2, 1)
    assert keys(plan) == [2, 5]


def test_importance_weights_truncate_and_mask_as_trl() -> None:
    current = torch.tensor([[0.0, math.log(5.0), 0.0], [math.log(0.5), 0.0, 0.0]])
    behaviour = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    truncated = importance_weights(current, behaviour, mask, "token_truncate", None, 3.0)
    assert torch.allclose(truncated, torch.tensor([[1.0, 3.0, 1.0], [0.5, 1.0, 1.0]]))
    masked = importance_weights(current, behaviour, mask, "token_mask", None, 3.0)
    assert torch.allclose(masked, torch.tensor([[1.0, 0.0, 1.0], [0.5, 1.0, 1.0]]))
    sequence = importance_weights(current, behaviour, mask, "sequence_truncate", None, 3.0)
    assert torch.allclose(sequence[0, :2], torch.tensor([3.0, 3.0]))  # 1 * 5, truncated
    assert torch.allclose(sequence[1], torch.full((3,), 0.5))
    assert sequence[0, 2] == 1.0  # outside the mask
    with pytest.raises(ValueError, match="importance sampling mode"):
        importance_weights(current, behaviour, mask, "sequence", None, 3.0)


def test_private_sampling_draws_from_its_own_generator_after_the_warpers() -> None:
    """Rollout threads sample beside the update: from a generator of their own, never the
    global RNG, and from the distribution transformers' warpers leave (temperature 0.5, top-3,
    then top-p 0.9 keep two tokens at 0.731 / 0.269)."""
    from transformers import GenerationConfig

    from kernelrl.rl.async_generate import private_sampling

    def draws(seed: int) -> list[int]:
        config = GenerationConfig(do_sample=True, temperature=0.5, top_k=3, top_p=0.9)
        processors = private_sampling(config, seed, torch.device("cpu"))
        assert config.do_sample is False  # greedy decoding picks the one token left
        scores = torch.tensor([[2.0, 1.5, 1.0, 0.5, -1.0]])
        return [int(processors(None, scores.clone()).argmax()) for _ in range(4000)]

    state = torch.get_rng_state()
    first = draws(7)
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG was not touched
    torch.manual_seed(123)
    assert draws(7) == first  # whatever the global RNG holds
    assert set(first) == {0, 1}
    assert abs(first.count(0) / len(first) - 0.731) < 0.03
    with pytest.raises(ValueError, match="typical_p"):
        private_sampling(GenerationConfig(typical_p=0.5), 0, torch.device("cpu"))
