"""kernelrl's environment behind OpenEnv's interface, with a real pool on CPU: reset/step/done as
kernelrl's multi-turn rollouts have them, rewards as kernelrl computes them, and a client that can
choose a task of the list but never bring one."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
from pydantic import ValidationError

from kernelrl.data.bundled import bundled_solution_path
from kernelrl.env.evaluator import EvalConfig
from kernelrl.env.pools.local import LocalPool
from kernelrl.env.result import EvalResult, Status
from kernelrl.launch.openenv_env import (
    MAX_COMPLETION_CHARS,
    KernelAction,
    KernelEnvironment,
    TaskList,
    judge_turn,
)
from kernelrl.prompts import (
    FEEDBACK_TEMPLATE,
    SYSTEM,
    MultiTurnConfig,
    answer_of,
    prompt_builders,
    revision_message,
)
from kernelrl.rewards import RewardConfig, reward_components, total_reward

SOLUTIONS = Path(__file__).parents[1] / "solutions" / "dynamic"
CORRECT = bundled_solution_path("01_relu").read_text()
WRONG = (
    "Here it is:\n```python\n" + (SOLUTIONS / "incorrect__wrong_threshold.py").read_text() + "```"
)
NO_CODE = "I would write a Triton kernel for this, but I am not sure how."


@pytest.fixture(scope="module")
def pool() -> LocalPool:
    with LocalPool(EvalConfig(device="cpu", timeout_s=60), workers=1) as pool:
        yield pool


@pytest.fixture(scope="module")
def tasks() -> TaskList:
    return TaskList.bundled("triton", ["01_relu", "02_gelu_tanh"])


def two_turns(pool: LocalPool, tasks: TaskList) -> KernelEnvironment:
    return KernelEnvironment(pool, tasks, turns=MultiTurnConfig(max_turns=2))


def test_reset_shows_the_prompt_training_gives_the_task(pool, tasks) -> None:
    env = two_turns(pool, tasks)
    observation = env.reset(task_id="02_gelu_tanh")
    task, _ = tasks.get("02_gelu_tanh")
    assert observation.messages == prompt_builders(None, SYSTEM)["triton"].first_messages(
        task.source
    )
    assert (observation.task_id, observation.turn, observation.done) == ("02_gelu_tanh", 0, False)
    assert observation.reward is None and observation.status is None
    # the same seed, the same task; the state lists what reset(task_id=) takes
    assert env.reset(seed=7).task_id == env.reset(seed=7).task_id
    assert env.state.task_ids == ["01_relu", "02_gelu_tanh"]


def test_a_correct_solution_is_rewarded_and_ends_the_episode(pool, tasks) -> None:
    env = two_turns(pool, tasks)
    env.reset(task_id="01_relu")
    observation = env.step(KernelAction(completion=CORRECT))
    assert observation.status == "correct" and observation.done
    assert observation.stop_reason == "correct" and observation.turn == 1
    assert observation.reward is not None and observation.reward > 0
    assert observation.reward_components["correctness_reward"] == 1.0
    assert env.state.rewards == [observation.reward] and env.state.done


def test_a_wrong_solution_gets_feedback_and_a_second_turn_until_max_turns(pool, tasks) -> None:
    env = two_turns(pool, tasks)
    first = env.reset(task_id="01_relu").messages
    observation = env.step(KernelAction(completion=WRONG))
    assert observation.status == "incorrect" and not observation.done
    assert "wrong" in observation.feedback and observation.reward is not None
    # the second turn is written after the feedback, in kernelrl's revision message
    assert observation.messages == [
        *first,
        {"role": "assistant", "content": answer_of(WRONG)},
        {"role": "user", "content": revision_message(FEEDBACK_TEMPLATE, observation.feedback)},
    ]
    last = env.step(KernelAction(completion=WRONG))
    assert last.done and last.stop_reason == "max_turns" and last.turn == 2
    with pytest.raises(ValueError, match="episode is over"):
        env.step(KernelAction(completion=CORRECT))  # no reward after the last turn
    assert env.state.statuses == ["incorrect", "incorrect"]


def test_a_format_error_is_judged_as_kernelrl_judges_it(pool, tasks) -> None:
    reward = RewardConfig(format_weight=0.5)
    env = KernelEnvironment(pool, tasks, turns=MultiTurnConfig(max_turns=2), reward=reward)
    env.reset(task_id="01_relu")
    observation = asyncio.run(env.step_async(KernelAction(completion=NO_CODE)))
    (direct,) = pool.evaluate([tasks.get("01_relu")[0]], [NO_CODE])
    assert direct.status is Status.FORMAT_ERROR
    assert observation.status == "format_error" and not observation.done
    assert observation.feedback == direct.feedback
    assert observation.reward == total_reward(direct, reward)
    assert observation.reward_components == reward_components(direct, reward)


def test_the_client_picks_a_task_of_the_list_and_never_brings_one(pool, tasks) -> None:
    env = two_turns(pool, tasks)
    with pytest.raises(ValueError, match="no episode"):
        env.step(KernelAction(completion=CORRECT))
    source = tasks.get("01_relu")[0].source
    for given in ({"task": {"id": "x", "source": source}}, {"source": source}, {"tasks": ["x"]}):
        with pytest.raises(ValueError, match="reset takes only seed, episode_id, task_id"):
            env.reset(**given)
    with pytest.raises(ValueError, match="episode_id must be a string"):
        env.reset(episode_id="x" * 256)
    with pytest.raises(ValueError, match="unknown task_id '03_silu_fp16'"):
        env.reset(task_id="03_silu_fp16")  # bundled, but not in this environment's list
    with pytest.raises(ValidationError):
        KernelAction(completion=CORRECT, task={"id": "x", "source": source})
    with pytest.raises(ValidationError):
        KernelAction(completion="x" * (MAX_COMPLETION_CHARS + 1))


def test_an_evaluation_that_fails_on_our_side_is_unscored_and_ends_the_episode(tasks) -> None:
    closed = LocalPool(EvalConfig(device="cpu", timeout_s=60), workers=1)
    closed.close()
    env = KernelEnvironment(closed, tasks, turns=MultiTurnConfig(max_turns=3))
    env.reset(task_id="01_relu")
    observation = env.step(KernelAction(completion=CORRECT))
    assert observation.status is None and observation.reward is None
    assert observation.done and observation.stop_reason == "env_error"
    assert "says nothing about your kernel" in observation.feedback


def test_a_harness_error_gets_no_reward_never_zero() -> None:
    result = EvalResult("01_relu", "triton", Status.HARNESS_ERROR, feedback="ours")
    turn = judge_turn(result, RewardConfig())
    assert turn.reward is None and not turn.scored
    assert turn.components and all(v is None for v in turn.components.values())
    assert math.isnan(total_reward(result))  # what kernelrl's reward says of it


def test_a_task_list_refuses_duplicates_and_unknown_bundled_ids(tasks) -> None:
    task, messages = tasks.get("01_relu")
    with pytest.raises(ValueError, match="appears twice"):
        TaskList([task, task])
    with pytest.raises(ValueError, match="no bundled task 'nope'"):
        TaskList.bundled("triton", ["01_relu", "nope"])
    rows = [{"id": "mine", "source": task.source, "prompt": [{"role": "user", "content": "hi"}]}]
    assert TaskList.from_rows(rows).get("mine")[1] == rows[0]["prompt"]
