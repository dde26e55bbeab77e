"""Multi-turn rollouts: the model writes a kernel, the environment answers, the model revises.

A rollout is kept as ONE token sequence per sample, the way TRL trains tool-calling rollouts:
``prompt_ids`` is the task prompt and ``completion_ids`` is every turn of the model with the
environment's feedback messages in between. ``env_mask`` marks the model's tokens (1) against
the feedback tokens (0, never trained on) and ``turn_index`` says which turn each model token
belongs to, so turn-level advantages can be laid over the tokens. Because the sequence the
model is trained on is exactly the context it generated from, multi-turn samples stay on-policy.

Context budget: with ``max_context_tokens`` set, a turn may generate at most what is left of
the budget (a longer completion is cut there, exactly as if it had been generated with that
limit), no turn starts with fewer than ``min_turn_tokens`` left (the rollout ends with reason
``context``), and feedback longer than ``max_feedback_tokens`` loses its middle.

Unscored turns: a turn whose evaluation came back ``harness_error`` (kernelrl's harness failed
even after the pool's retry) or not at all is *unscored*: it has no reward (never 0) and its
tokens get no advantage. The rollout of that sample stops there (``stop_reason="env_error"``):
the feedback would describe our failure, not the kernel, and a revision of a kernel nobody judged
would be a turn built on nothing.

Deferred last turn: with ``defer_last=True`` the evaluation of the last turn is submitted to
the pool but not waited for; the trainer collects it later, so evaluation overlaps with the
generation of the next batch (one-step off-policy).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from kernelrl.env.pools import Pool
from kernelrl.env.result import EvalResult, is_scored
from kernelrl.env.task import Task
from kernelrl.prompts import revision_message
from kernelrl.rewards import rewarded

# (prompt token ids, max new tokens, one seed per prompt or None) -> (completion ids, logprobs)
GenerateFn = Callable[
    [list[list[int]], int, list[int] | None], tuple[list[list[int]], list[list[float]] | None]
]


@dataclass
class RolloutConfig:
    max_turns: int = 1
    max_completion_length: int = 512  # per turn
    stop_when_correct: bool = True
    feedback_template: str = "{feedback}"
    max_feedback_tokens: int = 512
    max_context_tokens: int | None = None
    min_turn_tokens: int = 64


@dataclass
class Turn:
    completion_ids: list[int]
    text: str
    truncated: bool  # hit its token limit without an end-of-turn token
    result: EvalResult | Future | None = None
    error: str = ""  # why the result is missing (infrastructure failure)
    policy_step: int = 0  # the policy version (optimizer step) whose weights generated it

    @property
    def scored(self) -> bool:
        """Whether this turn has a verdict on its kernel: evaluated, and not a harness_error.
        Resolves a deferred evaluation first."""
        return is_scored(self.resolve())

    @property
    def rewarded(self) -> bool:
        """Whether this turn gets a reward: scored, and its speed judged where it was timed
        (``kernelrl.rewards.rewarded``)."""
        return rewarded(self.resolve())

    def resolve(self, timeout: float | None = None) -> EvalResult | None:
        """The EvalResult, waiting for a deferred evaluation; None if evaluation itself failed."""
        if isinstance(self.result, Future):
            try:
                self.result = self.result.result(timeout=timeout)
            except Exception as exc:  # the pool reports a broken task or a lost worker
                self.result, self.error = None, f"{type(exc).__name__}: {exc}"
        return self.result


@dataclass
class Trajectory:
    task: Task
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    turn_index: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    stop_reason: str = ""  # correct | max_turns | context | env_error (unscored last turn)
    policy_step: int = 0  # optimizer step of the oldest weights that generated a turn of it

    def _append(
        self, ids: Sequence[int], logprobs: Sequence[float | None] | None, turn: int
    ) -> None:
        self.completion_ids.extend(ids)
        self.logprobs.extend(logprobs if logprobs is not None else [None] * len(ids))
        self.env_mask.extend([1 if turn >= 0 else 0] * len(ids))
        self.turn_index.extend([turn] * len(ids))

    def results(self) -> list[EvalResult | None]:
        return [turn.resolve() for turn in self.turns]

    def to_record(self) -> dict[str, Any]:
        """Plain data (no futures): for checkpoints and the trajectories dataset schema."""
        results = self.results()
        return {
            "task": {
                "id": self.task.id,
                "source": self.task.source,
                "backend": self.task.backend,
                "category": self.task.category,
                "atol": self.task.atol,
                "rtol": self.task.rtol,
                "sizes": {k: dict(v) for k, v in self.task.sizes.items()},
                "level": self.task.level,
            },
            "prompt_ids": self.prompt_ids,
            "completion_ids": self.completion_ids,
            "logprobs": self.logprobs,
            "env_mask": self.env_mask,
            "turn_index": self.turn_index,
            "turns": [
                {
                    "completion_ids": t.completion_ids,
                    "text": t.text,
                    "truncated": t.truncated,
                    "result": None if r is None else r.to_dict(),
                    "error": t.error,
                    "policy_step": t.policy_step,
                }
                for t, r in zip(self.turns, results, strict=True)
            ],
            "stop_reason": self.stop_reason,
            "policy_step": self.policy_step,
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Trajectory:
        task = Task(**record["task"])
        turns = [
            Turn(
                completion_ids=list(t["completion_ids"]),
                text=t["text"],
                truncated=t["truncated"],
                result=None if t["result"] is None else EvalResult.from_dict(t["result"]),
                error=t["error"],
                policy_step=t.get("policy_step", record["policy_step"]),
            )
            for t in record["turns"]
        ]
        return cls(
            task=task,
            prompt_ids=list(record["prompt_ids"]),
            completion_ids=list(record["completion_ids"]),
            logprobs=list(record["logprobs"]),
            env_mask=list(record["env_mask"]),
            turn_index=list(record["turn_index"]),
            turns=turns,
            stop_reason=record["stop_reason"],
            policy_step=record["policy_step"],
        )


@dataclass
class RolloutStats:
    generation_s: float = 0.0
    evaluation_wait_s: float = 0.0  # time blocked on the pool between turns
    turns_generated: int = 0


class MultiTurnRollout:
    """Runs rollouts of a batch of prompts against the environment pool."""

    def __init__(
        self,
        tokenizer: Any,
        pool: Pool,
        config: RolloutConfig,
        eos_token_ids: Sequence[int],
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.pool = pool
        self.config = config
        self.eos_token_ids = list(eos_token_ids)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._suffix_cache: dict[str, list[int]] = {}
        # What a rollout is doing, for progress lines (launch's training progress sets it): a
        # step of several minutes is otherwise silent until it ends.
        self.on_phase: Callable[[str], None] | None = None

    def _phase(self, text: str) -> None:
        if self.on_phase is not None:
            self.on_phase(text)

    # ------------------------------------------------------------------ token plumbing
    def _chat_ids(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> list[int]:
        ids = self.tokenizer.apply_chat_template(
            messages,
            tokenize=True,
            add_generation_prompt=add_generation_prompt,
            return_dict=False,
            **self.chat_template_kwargs,
        )
        return list(ids)

    def feedback_ids(self, feedback: str) -> list[int]:
        """Tokens that follow a finished assistant turn: the user message carrying the
        feedback and the generation prompt of the next assistant turn.

        Found by rendering a dummy conversation with and without the extra message (as TRL does
        for tool results), so any chat template works without knowing its markup.
        """
        message = revision_message(self.config.feedback_template, self._cut_feedback(feedback))
        if message in self._suffix_cache:
            return self._suffix_cache[message]
        dummy = [{"role": "user", "content": "task"}, {"role": "assistant", "content": "answer"}]
        prefix = self._chat_ids(dummy, add_generation_prompt=False)
        full = self._chat_ids(dummy + [{"role": "user", "content": message}], True)
        # Templates render "<end-of-turn>\n" after an assistant turn; the model's own turn ends
        # at the end-of-turn token, so cut the prefix there.
        ends = [i for i, token in enumerate(prefix) if token in self.eos_token_ids]
        if ends:
            prefix = prefix[: ends[-1] + 1]
        if full[: len(prefix)] != prefix:
            raise ValueError(
                "the chat template does not render a conversation as a prefix of its extension"
            )
        suffix = full[len(prefix) :]
        self._suffix_cache[message] = suffix
        return suffix

    def _cut_feedback(self, feedback: str) -> str:
        limit = self.config.max_feedback_tokens
        ids = self.tokenizer.encode(feedback, add_special_tokens=False)
        if len(ids) <= limit:
            return feedback
        head = limit // 4
        tail = limit - head
        return (
            self.tokenizer.decode(ids[:head])
            + "\n[... feedback shortened ...]\n"
            + self.tokenizer.decode(ids[-tail:])
        )

    def _ends_turn(self, ids: Sequence[int]) -> bool:
        return bool(ids) and ids[-1] in self.eos_token_ids

    # ------------------------------------------------------------------ the loop
    def run(
        self,
        prompt_ids: Sequence[Sequence[int]],
        tasks: Sequence[Task],
        generate: GenerateFn,
        *,
        defer_last: bool = False,
        seeds: Sequence[int] | None = None,
        policy_step: int = 0,
        first_turn_generate: GenerateFn | None = None,
    ) -> tuple[list[Trajectory], RolloutStats]:
        """Roll out every prompt for up to ``max_turns`` turns.

        ``seeds``: one base seed per prompt; turn t of prompt i samples with ``seeds[i] + t``.
        ``first_turn_generate``: used for turn 0 instead of ``generate`` (a server can then
        sample a whole group of identical prompts in one request).
        """
        if len(prompt_ids) != len(tasks):
            raise ValueError(f"{len(prompt_ids)} prompts but {len(tasks)} tasks")
        stats = RolloutStats()
        trajectories = [
            Trajectory(task=task, prompt_ids=list(ids), policy_step=policy_step)
            for ids, task in zip(prompt_ids, tasks, strict=True)
        ]
        active = list(range(len(trajectories)))
        for turn in range(self.config.max_turns):
            limits = self._turn_limits(trajectories, active, turn)
            active = [i for i in active if i in limits]
            if not active:
                break
            fn = generate if turn > 0 or first_turn_generate is None else first_turn_generate
            self._generate_turn(trajectories, active, limits, turn, fn, seeds, stats)
            self._submit_turn(trajectories, active)
            last = turn == self.config.max_turns - 1
            if last and defer_last:
                for i in active:
                    trajectories[i].stop_reason = "max_turns"
                break
            active = self._judge_turn(trajectories, active, last, stats)
        for trajectory in trajectories:
            if not trajectory.stop_reason:
                trajectory.stop_reason = "max_turns"
        self._phase("rewards, advantages and the policy update")
        return trajectories, stats

    def _floor(self) -> int:
        """A turn capped by max_completion_length alone is a full turn, however short the cap."""
        return min(self.config.min_turn_tokens, self.config.max_completion_length)

    def _turn_limits(
        self, trajectories: list[Trajectory], active: list[int], turn: int
    ) -> dict[int, int]:
        """Tokens each active sample may generate this turn; a sample left with less than the
        floor of the context budget ends here (``context``) and gets no limit."""
        cfg = self.config
        limits = {}
        for i in active:
            limit = cfg.max_completion_length
            if cfg.max_context_tokens is not None:
                used = len(trajectories[i].prompt_ids) + len(trajectories[i].completion_ids)
                limit = min(limit, cfg.max_context_tokens - used)
            if turn == 0:
                limits[i] = max(limit, 1)
            elif limit < self._floor():
                trajectories[i].stop_reason = "context"
            else:
                limits[i] = limit
        return limits

    def _generate_turn(
        self,
        trajectories: list[Trajectory],
        active: list[int],
        limits: dict[int, int],
        turn: int,
        generate: GenerateFn,
        seeds: Sequence[int] | None,
        stats: RolloutStats,
    ) -> None:
        """One batched generation call for every active sample; each gets its new turn."""
        contexts = [trajectories[i].prompt_ids + trajectories[i].completion_ids for i in active]
        turn_seeds = None if seeds is None else [seeds[i] + turn for i in active]
        started = time.perf_counter()
        plural = "" if len(active) == 1 else "s"
        self._phase(f"generating turn {turn + 1} ({len(active)} sample{plural})")
        completions, logprobs = generate(contexts, max(limits[i] for i in active), turn_seeds)
        stats.generation_s += time.perf_counter() - started
        stats.turns_generated += len(active)
        for row, i in enumerate(active):
            ids = list(completions[row])[: limits[i]]
            lps = None if logprobs is None else list(logprobs[row])[: len(ids)]
            trajectory = trajectories[i]
            trajectory._append(ids, lps, turn)
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            trajectory.turns.append(
                Turn(
                    ids,
                    text,
                    truncated=not self._ends_turn(ids),
                    policy_step=trajectory.policy_step,
                )
            )

    def _submit_turn(self, trajectories: list[Trajectory], active: list[int]) -> None:
        """Hand the new turns to the pool, which judges each as it finishes."""
        turns = [trajectories[i].turns[-1] for i in active]
        futures = self.pool.submit([trajectories[i].task for i in active], [t.text for t in turns])
        for turn, future in zip(turns, futures, strict=True):
            turn.result = future

    def _judge_turn(
        self, trajectories: list[Trajectory], active: list[int], last: bool, stats: RolloutStats
    ) -> list[int]:
        """Wait for the turn's verdicts; the samples that go on get their feedback appended."""
        waited = time.perf_counter()
        results = {}
        for i in active:
            turn = len(trajectories[i].turns)
            self._phase(f"evaluating turn {turn} ({len(results)}/{len(active)} judged)")
            results[i] = trajectories[i].turns[-1].resolve()
        stats.evaluation_wait_s += time.perf_counter() - waited
        still = []
        for i in active:
            trajectory, result = trajectories[i], results[i]
            if not is_scored(result):  # no verdict: our failure
                trajectory.stop_reason = "env_error"
            elif self.config.stop_when_correct and result.correct:
                trajectory.stop_reason = "correct"
            elif last:
                trajectory.stop_reason = "max_turns"
            elif self._append_feedback(trajectory, result):
                still.append(i)
        return still

    def _append_feedback(self, trajectory: Trajectory, result: EvalResult) -> bool:
        """The revision message after a judged turn, unless it leaves less than a turn's floor
        of the context budget (then the rollout ends with ``context``)."""
        suffix = self.feedback_ids(result.feedback)
        if trajectory.turns[-1].truncated and self.eos_token_ids:
            suffix = [self.eos_token_ids[0], *suffix]  # close the unfinished turn
        used = len(trajectory.prompt_ids) + len(trajectory.completion_ids) + len(suffix)
        budget = self.config.max_context_tokens
        if budget is not None and budget - used < self._floor():
            trajectory.stop_reason = "context"
            return False
        trajectory._append(suffix, None, -1)
        return True
