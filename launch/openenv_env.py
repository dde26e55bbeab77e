"""kernelrl's environment behind OpenEnv's interface (``openenv-core``): ``reset()`` starts an
episode on one task of the environment's own list, ``step(KernelAction(completion=...))`` has the
completion judged by a pool and answers with kernelrl's feedback, its scalar reward and the
reward's components, turn after turn, as kernelrl's own multi-turn rollouts do.

Where the trust lies: the environment (this process) holds the task list, the reward config and
the conversation; a client only sends completions. A completion is never parsed for anything
but its text here and never run here: it goes to the pool, whose sandbox judges it, as in
training. A client can pick a task of the list by id (``reset(task_id=...)``), never give one:
``reset`` refuses every other argument, and the action has no field but the completion.

Why in ``launch/``: the environment joins ``env`` (pools, results), ``prompts`` (the prompt and
the revision message) and ``rewards`` (the scalar reward), and its default task list is the
bundled one of ``data``; only ``launch`` may import all of them.
"""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from openenv.core import EnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server import Action, Environment, Observation, State
from pydantic import Field

from kernelrl.env.pools.base import Pool
from kernelrl.env.pools.service import read_token
from kernelrl.env.result import EvalResult, is_scored
from kernelrl.env.task import Task, task_from_row
from kernelrl.prompts import SYSTEM, MultiTurnConfig, answer_of, prompt_builders, revision_message
from kernelrl.rewards import RewardConfig, reward_components, total_reward

#: The longest completion a step takes (characters): a 32k-token answer is about 130k.
MAX_COMPLETION_CHARS = 256_000
#: What ``reset`` takes: the rest (a task, a task file, a dataset) is the server's to choose.
RESET_KEYS = ("seed", "episode_id", "task_id")
#: The name ``kernelrl env openenv-serve`` keeps its bearer token under (``read_token``).
OPENENV_SERVICE = "kernelrl-openenv"

Messages = list[dict[str, str]]


class KernelAction(Action):
    """One attempt: the model's completion (its answer with a ```python block defining
    ``ModelNew``), judged as kernelrl judges a training turn. Nothing else: the task, the
    reference and the verdict are the environment's."""

    completion: str = Field(
        ..., max_length=MAX_COMPLETION_CHARS, description="the model's answer for this turn"
    )


class KernelObservation(Observation):
    """What a client sees after ``reset`` (the task's prompt) or a ``step`` (the verdict)."""

    task_id: str = Field(..., description="the task of this episode (from the server's list)")
    backend: str = Field(..., description="kernel language asked for: triton or cuda")
    messages: Messages = Field(
        ..., description="the conversation to write the next turn from (chat messages)"
    )
    turn: int = Field(0, ge=0, description="attempts judged so far in this episode")
    max_turns: int = Field(..., ge=1, description="attempts an episode gets")
    status: str | None = Field(
        None, description="the verdict of the last attempt (kernelrl's Status); None: none"
    )
    feedback: str = Field("", description="the environment's feedback on the last attempt")
    reward_components: dict[str, float | None] = Field(
        default_factory=dict, description="the reward's components, unweighted (None: unscored)"
    )
    stop_reason: str = Field(
        "", description="why the episode ended: correct, max_turns or env_error ('' while on)"
    )


class KernelState(State):
    """The episode as the environment keeps it (``state``), and the tasks it may choose."""

    task_id: str | None = None
    turn: int = 0
    max_turns: int = 1
    done: bool = False
    stop_reason: str = ""
    statuses: list[str | None] = Field(default_factory=list)
    rewards: list[float | None] = Field(default_factory=list)
    task_ids: list[str] = Field(default_factory=list, description="what reset(task_id=) takes")


class TaskList:
    """The tasks an environment chooses from, each with the messages of its first turn: fixed
    when the environment is built, shared read-only by every session."""

    def __init__(self, tasks: Sequence[Task], prompts: Sequence[Messages] | None = None) -> None:
        if not tasks:
            raise ValueError("the environment needs at least one task")
        if prompts is None:
            builders = prompt_builders(None, SYSTEM)
            prompts = [builders[t.backend].first_messages(t.source) for t in tasks]
        if len(prompts) != len(tasks):
            raise ValueError(f"{len(tasks)} tasks but {len(prompts)} prompts")
        self._entries: dict[str, tuple[Task, Messages]] = {}
        for task, messages in zip(tasks, prompts, strict=True):
            if task.id in self._entries:
                raise ValueError(f"task id {task.id!r} appears twice in the task list")
            self._entries[task.id] = (task, [dict(m) for m in messages])
        self.ids = list(self._entries)

    @classmethod
    def from_rows(cls, rows: Sequence[Mapping[str, Any]]) -> TaskList:
        """Task rows with their ``prompt`` (``kernelrl.launch.train_cli.build_task_dataset``:
        the tasks and prompts a training recipe would use)."""
        return cls([task_from_row(r) for r in rows], [list(r["prompt"]) for r in rows])

    @classmethod
    def bundled(cls, backend: str = "triton", ids: Sequence[str] | None = None) -> TaskList:
        """kernelrl's bundled tasks (``ids``: only those, in that order)."""
        from kernelrl.data.bundled import bundled_tasks

        tasks = {t.id: t for t in bundled_tasks(backend)}
        unknown = [i for i in ids or () if i not in tasks]
        if unknown:
            raise ValueError(f"no bundled task {', '.join(map(repr, unknown))}")
        return cls([tasks[i] for i in ids] if ids else list(tasks.values()))

    def __len__(self) -> int:
        return len(self.ids)

    def get(self, task_id: str) -> tuple[Task, Messages]:
        if task_id not in self._entries:
            raise ValueError(f"unknown task_id {task_id!r}: this environment has {len(self)} tasks")
        task, messages = self._entries[task_id]
        return task, [dict(m) for m in messages]


class KernelEnvironment(Environment[KernelAction, KernelObservation, KernelState]):
    """One episode at a time on one task: up to ``max_turns`` attempts, ended early by a correct
    one (``stop_when_correct``) or by an attempt that got no verdict (kernelrl's failure:
    ``harness_error`` or no result), exactly as ``kernelrl.rl.rollout`` ends a sample.

    ``pool``: any ``Pool`` (``LocalPool``, ``RayPool``, ``ServiceClient``); shared by every
    environment a server makes, and closed by ``close`` only with ``owns_pool``."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # sessions share only the pool and the read-only tasks

    def __init__(
        self,
        pool: Pool,
        tasks: TaskList | None = None,
        *,
        turns: MultiTurnConfig | None = None,
        reward: RewardConfig | None = None,
        owns_pool: bool = False,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        self.pool = pool
        self.tasks = tasks if tasks is not None else TaskList.bundled()
        self.turns = turns or MultiTurnConfig()
        self.turns.check_turns()
        self.reward = reward or RewardConfig()
        self.owns_pool = owns_pool
        self._rng = random.Random(seed)
        self._task: Task | None = None
        self._messages: Messages = []
        self._state = KernelState(max_turns=self.turns.max_turns, task_ids=self.tasks.ids)

    # ------------------------------------------------------------------ OpenEnv's interface
    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        task_id: str | None = None,
        **kwargs: Any,
    ) -> KernelObservation:
        """A new episode on ``task_id`` (one of the list), else on a task drawn with ``seed``
        (the same seed, the same task), else on a random one."""
        if kwargs:
            raise ValueError(
                f"reset takes only {', '.join(RESET_KEYS)}, not {', '.join(sorted(kwargs))}: "
                "the tasks are this environment's own (reset(task_id=...) picks one of them)"
            )
        if episode_id is not None and (not isinstance(episode_id, str) or len(episode_id) > 255):
            raise ValueError("episode_id must be a string of at most 255 characters")
        if task_id is None:
            rng = random.Random(seed) if seed is not None else self._rng
            task_id = self.tasks.ids[rng.randrange(len(self.tasks))]
        self._task, self._messages = self.tasks.get(str(task_id))
        self._state = KernelState(
            episode_id=episode_id or uuid.uuid4().hex,
            task_id=self._task.id,
            max_turns=self.turns.max_turns,
            task_ids=self.tasks.ids,
        )
        return self._observation()

    def step(
        self, action: KernelAction, timeout_s: float | None = None, **kwargs: Any
    ) -> KernelObservation:
        """Judge one completion (blocks until the pool answers). ``timeout_s`` is not the
        client's to set: the pool's own limit applies."""
        task = self._check_step(action)
        try:
            result: EvalResult | None = self.pool.evaluate([task], [action.completion])[0]
            error = ""
        except Exception as exc:  # a broken task, a lost worker or service: ours, not the kernel's
            result, error = None, f"{type(exc).__name__}: {exc}"
        return self._judged(action.completion, result, error)

    async def step_async(
        self, action: KernelAction, timeout_s: float | None = None, **kwargs: Any
    ) -> KernelObservation:
        """``step`` without holding a thread while the pool works (OpenEnv's server awaits it)."""
        task = self._check_step(action)
        try:
            results = await self.pool.aevaluate([task], [action.completion])
            result: EvalResult | None = results[0]
            error = ""
        except Exception as exc:
            result, error = None, f"{type(exc).__name__}: {exc}"
        return self._judged(action.completion, result, error)

    @property
    def state(self) -> KernelState:
        return self._state.model_copy(deep=True)

    def close(self) -> None:
        if self.owns_pool:
            self.pool.close()

    # ------------------------------------------------------------------ one turn
    def _check_step(self, action: KernelAction) -> Task:
        if not isinstance(action, KernelAction):
            raise TypeError(f"step takes a KernelAction, got {type(action).__name__}")
        if self._task is None:
            raise ValueError("no episode: call reset() first")
        if self._state.done:
            raise ValueError(
                f"the episode is over ({self._state.stop_reason}): call reset() for a new one"
            )
        return self._task

    def _judged(self, completion: str, result: EvalResult | None, error: str) -> KernelObservation:
        """The observation of a judged turn; the episode's state moves on."""
        turn = judge_turn(result, self.reward, error)
        state = self._state
        state.turn += 1
        state.step_count += 1
        state.statuses.append(turn.status)
        state.rewards.append(turn.reward)
        if not turn.scored:
            state.stop_reason = "env_error"
        elif self.turns.stop_when_correct and turn.status == "correct":
            state.stop_reason = "correct"
        elif state.turn >= self.turns.max_turns:
            state.stop_reason = "max_turns"
        state.done = bool(state.stop_reason)
        if not state.done:
            self._messages = [
                *self._messages,
                {"role": "assistant", "content": answer_of(completion)},
                {
                    "role": "user",
                    "content": revision_message(
                        self.turns.feedback_template, turn.feedback.strip() or "(no feedback)"
                    ),
                },
            ]
        return self._observation(turn)

    def _observation(self, turn: JudgedTurn | None = None) -> KernelObservation:
        assert self._task is not None
        return KernelObservation(
            task_id=self._task.id,
            backend=self._task.backend,
            messages=[dict(m) for m in self._messages],
            turn=self._state.turn,
            max_turns=self.turns.max_turns,
            status=turn.status if turn else None,
            feedback=turn.feedback if turn else "",
            reward_components=dict(turn.components) if turn else {},
            stop_reason=self._state.stop_reason,
            done=self._state.done,
            reward=turn.reward if turn else None,
        )


@dataclass(frozen=True)
class JudgedTurn:
    """A verdict as the client receives it: NaN (kernelrl's "unscored") becomes None."""

    status: str | None
    feedback: str
    reward: float | None
    components: dict[str, float | None]
    scored: bool  # a verdict on the kernel: evaluated, and not a harness_error


def judge_turn(result: EvalResult | None, config: RewardConfig, error: str = "") -> JudgedTurn:
    """Status, feedback, reward and components of one turn. A turn without a verdict (no
    result, or ``harness_error``) gets no reward, never 0: it says nothing about the kernel."""
    if result is None:
        feedback = (
            "The evaluation failed on the environment's side; this says nothing about your "
            f"kernel and is not scored. ({error or 'no result'})"
        )
        return JudgedTurn(None, feedback, None, {}, scored=False)
    components = {k: _finite(v) for k, v in reward_components(result, config).items()}
    scored = is_scored(result)
    reward = _finite(total_reward(result, config)) if scored else None
    return JudgedTurn(str(result.status), result.feedback, reward, components, scored)


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


class KernelEnvClient(EnvClient[KernelAction, KernelObservation, KernelState]):
    """OpenEnv's WebSocket client for ``kernelrl env openenv-serve``: each client is one
    session (one episode at a time) on the server. ``token``: the server's bearer token;
    default ``read_token(name)``, as every client of kernelrl's services reads one
    (``$KERNELRL_OPENENV_TOKEN``, else the file the server wrote on this machine).
    ``message_timeout_s``: one step waits for a whole evaluation, so it is longer than
    OpenEnv's default."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        name: str = OPENENV_SERVICE,
        message_timeout_s: float = 900.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(base_url, message_timeout_s=message_timeout_s, **kwargs)
        self._token = token if token is not None else read_token(name)

    async def connect(self) -> KernelEnvClient:
        """OpenEnv's connect, with the bearer token on the WebSocket handshake."""
        from websockets.asyncio.client import connect as ws_connect

        if self._ws is not None:
            return self
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else None
        local = any(h in self._ws_url.lower() for h in ("://localhost", "://127.0.0.1", "://[::1]"))
        try:
            self._ws = await ws_connect(
                self._ws_url,
                open_timeout=self._connect_timeout,
                max_size=self._max_message_size,
                additional_headers=headers,
                proxy=None if local else True,
            )
        except Exception as exc:
            raise ConnectionError(f"cannot connect to {self._ws_url}: {exc}") from exc
        return self

    def _step_payload(self, action: KernelAction) -> dict[str, Any]:
        return {"completion": action.completion}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[KernelObservation]:
        observation = KernelObservation(
            **payload.get("observation", {}),
            reward=payload.get("reward"),
            done=payload.get("done", False),
        )
        return StepResult(observation, observation.reward, observation.done)

    def _parse_state(self, payload: dict[str, Any]) -> KernelState:
        return KernelState(**payload)


__all__ = [
    "KernelAction",
    "KernelEnvClient",
    "KernelEnvironment",
    "KernelObservation",
    "KernelState",
    "TaskList",
    "judge_turn",
]
