"""Multi-turn rollouts (rl/rollout.py): which tokens are trained on, which turn each belongs to,
the context budget, feedback truncation, stop reasons and the deferred last turn.

Generation is scripted token ids (what the model "says" is chosen by the test); the tokenizer
and its chat template are SmolLM2's, so feedback tokens are rendered as in training.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future

import pytest
from rl_support import VerdictPool, tokenizer

from kernelrl.env.result import Status
from kernelrl.env.task import Task
from kernelrl.rl.rollout import MultiTurnRollout, RolloutConfig

TASKS = [Task(id="a", source="src_a"), Task(id="b", source="src_b")]


@pytest.fixture(scope="module")
def tok():
    return tokenizer()


class Script:
    """A generate function that answers turn t of prompt i with ``answers[i][t]``."""

    def __init__(self, answers: list[list[list[int]]]) -> None:
        self.answers = answers
        self.calls: list[tuple[list[list[int]], int, list[int] | None]] = []

    def __call__(self, contexts, max_new_tokens, seeds):  # noqa: ANN001
        self.calls.append(([list(c) for c in contexts], max_new_tokens, seeds))
        turn = len(self.calls) - 1
        rows = self.active_rows(contexts)
        return [self.answers[i][turn] for i in rows], None

    def active_rows(self, contexts: Sequence[Sequence[int]]) -> list[int]:
        # prompts are [1000 + i], so a context's first token names its row
        return [c[0] - 1000 for c in contexts]


def rollout(tok, pool, **config) -> MultiTurnRollout:  # noqa: ANN001
    return MultiTurnRollout(tok, pool, RolloutConfig(**config), eos_token_ids=[tok.eos_token_id])


def by_status(*per_task: Sequence[Status]):  # noqa: ANN201
    """Verdict: task a gets per_task[0][k] on its k-th evaluation, task b per_task[1][k]."""
    seen: dict[str, int] = {}

    def verdict(task: Task, solution: str, call: int) -> Status:
        k = seen.get(task.id, 0)
        seen[task.id] = k + 1
        return per_task[[t.id for t in TASKS].index(task.id)][k]

    return verdict


def test_feedback_tokens_are_masked_and_turns_indexed(tok) -> None:  # noqa: ANN001
    eos = tok.eos_token_id
    a0, a1 = [11, 12, eos], [13, 14, 15, eos]
    b0, b1, b2 = [21, eos], [22, 23], [24, eos]  # b1 is cut by the token limit: no eos
    pool = VerdictPool(
        by_status(
            [Status.INCORRECT, Status.CORRECT],
            [Status.FORMAT_ERROR, Status.COMPILE_ERROR, Status.FORMAT_ERROR],
        )
    )
    script = Script([[a0, a1], [b0, b1, b2]])
    runner = rollout(tok, pool, max_turns=3, max_completion_length=8)
    trajectories, stats = runner.run([[1000, 7], [1001, 7]], TASKS, script, seeds=[100, 200])

    a, b = trajectories
    feedback_a = runner.feedback_ids("verdict: incorrect")
    assert a.completion_ids == a0 + feedback_a + a1
    assert a.env_mask == [1] * 3 + [0] * len(feedback_a) + [1] * 4
    assert a.turn_index == [0] * 3 + [-1] * len(feedback_a) + [1] * 4
    assert a.stop_reason == "correct" and len(a.turns) == 2

    feedback_b0 = runner.feedback_ids("verdict: format_error")
    # an unfinished turn is closed with the end-of-turn token, which is feedback (never trained)
    feedback_b1 = [eos, *runner.feedback_ids("verdict: compile_error")]
    assert b.completion_ids == b0 + feedback_b0 + b1 + feedback_b1 + b2
    assert b.env_mask == (
        [1] * 2 + [0] * len(feedback_b0) + [1] * 2 + [0] * len(feedback_b1) + [1] * 2
    )
    assert b.turn_index == (
        [0] * 2 + [-1] * len(feedback_b0) + [1] * 2 + [-1] * len(feedback_b1) + [2] * 2
    )
    assert b.stop_reason == "max_turns" and [t.truncated for t in b.turns] == [False, True, False]
    # the model generated exactly from the sequence it will be trained on
    assert script.calls[2][0] == [[1001, 7, *b0, *feedback_b0, *b1, *feedback_b1]]
    # turn t of prompt i samples with seeds[i] + t; finished prompts are not generated again
    assert [c[2] for c in script.calls] == [[100, 200], [101, 201], [202]]
    assert stats.turns_generated == 5
    # the feedback message is the user turn of the chat template, ending in a generation prompt
    text = tok.decode(feedback_a)
    assert "verdict: incorrect" in text and text.rstrip().endswith("assistant")


def test_unscored_turn_ends_its_rollout(tok) -> None:  # noqa: ANN001
    eos = tok.eos_token_id
    pool = VerdictPool(by_status([Status.HARNESS_ERROR], [Status.INCORRECT, Status.INCORRECT]))
    script = Script([[[5, eos]], [[6, eos], [7, eos]]])
    (a, b), _ = rollout(tok, pool, max_turns=2).run([[1000], [1001]], TASKS, script)
    assert a.stop_reason == "env_error" and not a.turns[0].scored and len(a.turns) == 1
    assert a.completion_ids == [5, eos]  # no feedback appended after our own failure
    assert b.stop_reason == "max_turns" and all(t.scored for t in b.turns)


def test_context_budget_limits_and_stops_turns(tok) -> None:  # noqa: ANN001
    eos = tok.eos_token_id
    long = list(range(30, 70))  # 40 tokens, no eos
    pool = VerdictPool(by_status([Status.FORMAT_ERROR] * 3, [Status.FORMAT_ERROR] * 3))
    runner = rollout(
        tok, pool, max_turns=3, max_completion_length=32, max_context_tokens=90, min_turn_tokens=8
    )
    feedback = len(runner.feedback_ids("verdict: format_error"))
    prompt_a, prompt_b = [1000] + [7] * 9, [1001] + [7] * 69  # 10 and 70 tokens
    script = Script([[long, [8, eos], [9, eos]], [long, [8, eos]]])
    (a, b), _ = runner.run([prompt_a, prompt_b], TASKS, script)
    # turn 0: a may use 32 (max_completion_length), b only 90 - 70 = 20: the call asks for the
    # largest limit and each completion is cut to its own
    assert script.calls[0][1] == 32
    assert a.turns[0].completion_ids == long[:32] and b.turns[0].completion_ids == long[:20]
    # b: 70 + 20 + eos + feedback leaves fewer than min_turn_tokens: no second turn
    assert b.stop_reason == "context" and len(b.turns) == 1
    assert b.completion_ids == long[:20]  # the feedback that did not fit was not appended
    # a: its second turn gets what is left of the budget
    used = 10 + 32 + 1 + feedback
    assert script.calls[1][1] == min(32, 90 - used)
    assert len(a.prompt_ids) + len(a.completion_ids) <= 90
    assert a.stop_reason in ("context", "max_turns")


def test_long_feedback_loses_its_middle(tok) -> None:  # noqa: ANN001
    runner = rollout(tok, VerdictPool(lambda *_: Status.INCORRECT), max_feedback_tokens=20)
    words = " ".join(f"w{i}" for i in range(300))
    cut = runner._cut_feedback(words)
    assert "[... feedback shortened ...]" in cut
    head, tail = cut.split("\n[... feedback shortened ...]\n")
    assert words.startswith(head) and words.endswith(tail)
    assert len(tok.encode(head, add_special_tokens=False)) == 20 // 4
    assert len(tok.encode(tail, add_special_tokens=False)) == 20 - 20 // 4
    assert runner._cut_feedback("short") == "short"
    short = runner.feedback_ids(words)
    assert len(short) < len(tok.encode(words, add_special_tokens=False))


def test_deferred_last_turn_is_left_in_flight(tok) -> None:  # noqa: ANN001
    eos = tok.eos_token_id
    pool = VerdictPool(lambda *_: Status.INCORRECT)
    runner = rollout(tok, pool, max_turns=2)
    script = Script([[[5, eos], [6, eos]], [[7, eos], [8, eos]]])
    pool.hold = False
    first = pool.submit  # turn 0 answered at once, turn 1 held

    def submit(tasks, solutions):  # noqa: ANN001, ANN202
        pool.hold = pool.calls >= len(TASKS)
        return first(tasks, solutions)

    pool.submit = submit  # type: ignore[method-assign]
    (a, b), stats = runner.run([[1000], [1001]], TASKS, script, defer_last=True, policy_step=4)
    for trajectory in (a, b):
        assert isinstance(trajectory.turns[-1].result, Future)
        assert not trajectory.turns[-1].result.done()  # returned without waiting
        assert trajectory.stop_reason == "max_turns" and trajectory.policy_step == 4
    pool.release()
    assert [r.status for r in a.results()] == [Status.INCORRECT, Status.INCORRECT]
    # a checkpointed pending batch round-trips (futures resolved to plain records)
    from kernelrl.rl.rollout import Trajectory

    again = Trajectory.from_record(a.to_record())
    assert again.completion_ids == a.completion_ids and again.env_mask == a.env_mask
    assert [r.status for r in again.results()] == [Status.INCORRECT, Status.INCORRECT]


def test_the_rollout_says_what_it_is_doing(tok) -> None:  # noqa: ANN001
    """Progress lines name the phase of a step of several minutes (launch's training progress
    sets ``on_phase``): each turn's generation, its evaluations as they are judged, the update."""
    eos = tok.eos_token_id
    pool = VerdictPool(by_status([Status.INCORRECT, Status.CORRECT], [Status.CORRECT]))
    script = Script([[[11, eos], [12, eos]], [[21, eos]]])
    runner = rollout(tok, pool, max_turns=2, max_completion_length=8)
    phases: list[str] = []
    runner.on_phase = phases.append
    runner.run([[1000, 7], [1001, 7]], TASKS, script)
    assert phases == [
        "generating turn 1 (2 samples)",
        "evaluating turn 1 (0/2 judged)",
        "evaluating turn 1 (1/2 judged)",
        "generating turn 2 (1 sample)",
        "evaluating turn 2 (0/1 judged)",
        "rewards, advantages and the policy update",
    ]
