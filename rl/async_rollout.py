"""Asynchronous rollouts: generation runs ahead of the update, bounded in staleness.

``AsyncRollouts`` holds the generation batches the trainer hands it (in data order, up to
``max_staleness`` batches ahead of the step being trained) and rolls each out in a thread of
its own with ``MultiTurnRollout.run``, while the main thread trains. Generation calls are
serialized by one lock (there is one generator: a server, an engine or a copy of the policy),
which the main thread also takes to load new weights into the generator after each optimizer
step (``publish``); the version of the weights every turn was generated with is recorded on the
turn, and a sample's version is that of its oldest turn. Every generation call runs on the
process's one generation thread, whichever batch asks (``on_generation_thread``): PyTorch keeps
the CUDA graphs of a compiled decode step per thread, so a call from each batch's new thread
would record them all again, and a thread that ends tears its graphs down while others run.

- **Generation never waits for the update**: batch ``k`` starts as soon as the generator holds
  weights of version ``k - max_staleness`` or later, whatever step the trainer is on; only the
  loading of new weights pauses it.
- **The environment never waits for generation**: each turn is handed to the pool as soon as
  it is generated and judged as it finishes; while a batch waits for its verdicts, the other
  batches in flight generate. The last turn's verdicts wait for nobody (``defer_last``).
- **A step trains on complete groups** (``take``, scheduled by ``async_schedule.plan_step``):
  groups still waiting on the environment carry over to a later step, but never past their
  deadline (``version + max_staleness``): then the step waits for them.

Within one batch, turn ``t + 1`` is generated once that batch's turn ``t`` is judged, as in
the synchronous rollout: the same seeds and the same batched calls, so that with
``max_staleness: 0`` (every batch starts on the weights it is trained with and is due at once)
the samples and the update are those of the synchronous trainer.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from kernelrl.env.task import Task
from kernelrl.rl.async_generate import Completions, Generator
from kernelrl.rl.async_schedule import Slot, plan_step
from kernelrl.rl.rollout import MultiTurnRollout, RolloutStats, Trajectory
from kernelrl.rl.steps import RolloutBatch, batch_key


class RolloutsClosed(RuntimeError):
    """Generation was asked for after the engine shut down."""


@dataclass
class Job:
    """One generation batch: its rows, what it needs to start, and what it produced."""

    order: int  # position in data order
    rows: list[dict[str, Any]]
    prompt_ids: list[list[int]]
    tasks: list[Task]
    seeds: list[int] | None
    versions: list[int] = field(default_factory=list)  # per generation call (= per turn)
    trajectories: list[Trajectory] | None = None
    stats: RolloutStats | None = None
    error: BaseException | None = None
    started: bool = False
    finished: bool = False
    stats_taken: bool = False


@dataclass
class Group:
    """``size`` consecutive rows of a job: the samples of one prompt."""

    job: Job
    start: int
    size: int
    waiting: set = field(default_factory=set)  # futures of its turns not yet judged

    @property
    def version(self) -> int:
        return self.job.versions[0] if self.job.versions else 1 << 62

    @property
    def complete(self) -> bool:
        return self.job.finished and not self.waiting

    def trajectories(self) -> list[Trajectory]:
        assert self.job.trajectories is not None
        return self.job.trajectories[self.start : self.start + self.size]


@dataclass
class Taken:
    """What a step trains: the rows and their rollouts, with how the step got them."""

    rows: list[dict[str, Any]]
    batch: RolloutBatch
    waited_s: float  # the main thread blocked on generation or the environment
    carried: int  # groups left in flight for later steps


class AsyncRollouts:
    """See the module docstring. ``group_size``: samples per prompt (``num_generations``)."""

    def __init__(
        self,
        rollout: MultiTurnRollout,
        generator: Generator,
        max_staleness: int,
        group_size: int,
    ) -> None:
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        self.rollout = rollout
        self.generator = generator
        self.max_staleness = max_staleness
        self.group_size = group_size
        self.version = 0
        self._generation = threading.Lock()  # one generation call, or a weight load
        self._changed = threading.Condition()  # a job finished or a verdict came in
        self._jobs: list[Job] = []
        self._groups: list[Group] = []
        self._threads: list[threading.Thread] = []
        self._closed = False
        # intra-op threads are set per thread: the generation thread computes as the main one does
        self._torch_threads = torch.get_num_threads()

    # ------------------------------------------------------------------ main thread
    def submit(
        self,
        order: int,
        rows: list[dict[str, Any]],
        prompt_ids: list[list[int]],
        tasks: list[Task],
        seeds: list[int] | None,
    ) -> None:
        """Queue a generation batch; it starts once the weights are recent enough."""
        if len(rows) % self.group_size:
            raise ValueError(f"{len(rows)} rows are not whole groups of {self.group_size}")
        for start in range(0, len(rows), self.group_size):
            ids = {batch_key([row]) for row in rows[start : start + self.group_size]}
            if len(ids) != 1:
                raise ValueError("a group's rows are not samples of one prompt")
        job = Job(order, rows, prompt_ids, tasks, seeds)
        with self._changed:
            self._jobs.append(job)
            self._groups += [
                Group(job, s, self.group_size) for s in range(0, len(rows), self.group_size)
            ]
        self._start_ready()

    def publish(self, version: int, load: Callable[[], None] | None = None) -> None:
        """New weights (optimizer step ``version``): loaded into the generator with generation
        paused, then the batches they allow start."""
        with self._generation:
            (load or self.generator.load_weights)()
            self.version = version
            self._torch_threads = torch.get_num_threads()
        self._start_ready()

    def take(self, step: int, rows: int) -> Taken:
        """The ``rows`` rows (whole groups) that optimizer step ``step`` trains."""
        count = rows // self.group_size
        waited = time.perf_counter()
        with self._changed:
            while True:
                self._raise_failures()
                slots = {id(g): g for g in self._groups}
                plan = plan_step(
                    [Slot(id(g), g.job.order, g.version, g.complete) for g in self._groups],
                    step,
                    count,
                    self.max_staleness,
                )
                chosen = [slots[s.key] for s in plan]
                if all(g.complete for g in chosen):
                    break
                self._changed.wait(timeout=1.0)
            for group in chosen:
                self._groups.remove(group)
            carried = len(self._groups)
        trajectories = [t for g in chosen for t in g.trajectories()]
        taken_rows = [r for g in chosen for r in g.job.rows[g.start : g.start + g.size]]
        return Taken(
            taken_rows,
            RolloutBatch(batch_key(taken_rows), trajectories, self._stats(chosen)),
            time.perf_counter() - waited,
            carried,
        )

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No generation call runs inside (the main thread generates itself, e.g. for an
        evaluation)."""
        with self._generation:
            yield

    def in_flight(self) -> int:
        """Groups submitted and not yet trained."""
        with self._changed:
            return len(self._groups)

    def close(self) -> None:
        """Stop starting work; threads in a generation call end with it."""
        self._closed = True
        with self._changed:
            self._changed.notify_all()

    # ------------------------------------------------------------------ internals
    def _start_ready(self) -> None:
        with self._changed:
            ready = [
                j
                for j in self._jobs
                if not j.started and j.order <= self.version + self.max_staleness
            ]
            for job in ready:
                job.started = True
        for job in ready:
            thread = threading.Thread(
                target=self._run, args=(job,), name=f"rollout-{job.order}", daemon=True
            )
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
            thread.start()

    def _generate(self, job: Job) -> Callable[..., Completions]:
        def generate(contexts: list[list[int]], max_new: int, seeds: list[int] | None) -> Any:
            with self._generation:
                if self._closed:
                    raise RolloutsClosed("the asynchronous rollouts were closed")
                job.versions.append(self.version)
                return on_generation_thread(self._call, contexts, max_new, seeds)

        return generate

    def _call(self, contexts: list[list[int]], max_new: int, seeds: list[int] | None) -> Any:
        """One generation call, on the generation thread."""
        if torch.get_num_threads() != self._torch_threads:
            # only when they differ: setting it also turns off MKL's dynamic threading for the
            # whole process, which changes the main thread's gradients in the last bits (the
            # main thread differs only if it set its count itself, which did the same already)
            torch.set_num_threads(self._torch_threads)
        return self.generator.generate(contexts, max_new, seeds)

    def _run(self, job: Job) -> None:
        try:
            trajectories, stats = self.rollout.run(
                job.prompt_ids,
                job.tasks,
                self._generate(job),
                defer_last=True,
                seeds=job.seeds,
            )
            for trajectory in trajectories:
                for turn, version in zip(trajectory.turns, job.versions, strict=False):
                    turn.policy_step = version
                trajectory.policy_step = job.versions[0] if job.versions else self.version
        except BaseException as exc:  # reported to the main thread by take()
            with self._changed:
                job.error = exc
                self._changed.notify_all()
            return
        with self._changed:
            job.trajectories, job.stats, job.finished = trajectories, stats, True
            for group in self._groups:
                if group.job is job:
                    self._watch(group)
            self._changed.notify_all()

    def _watch(self, group: Group) -> None:
        """Track the group's unjudged turns; each verdict that comes in wakes ``take``."""
        for trajectory in group.trajectories():
            for turn in trajectory.turns:
                future = turn.result
                if hasattr(future, "add_done_callback") and not future.done():
                    group.waiting.add(future)
                    future.add_done_callback(lambda f, g=group: self._judged(g, f))

    def _judged(self, group: Group, future: Any) -> None:
        with self._changed:
            group.waiting.discard(future)
            self._changed.notify_all()

    def _raise_failures(self) -> None:
        failed = next((j for j in self._jobs if j.error is not None), None)
        if failed is not None:
            raise RuntimeError(
                f"generation of batch {failed.order} failed: {type(failed.error).__name__}: "
                f"{failed.error}"
            ) from failed.error
        self._jobs = [j for j in self._jobs if not (j.finished and j.stats_taken)]

    def _stats(self, chosen: list[Group]) -> RolloutStats:
        """Generation time of the jobs this step is the first to train from."""
        stats = RolloutStats()
        for job in {id(g.job): g.job for g in chosen}.values():
            if job.stats is not None and not job.stats_taken:
                job.stats_taken = True
                stats.generation_s += job.stats.generation_s
                stats.evaluation_wait_s += job.stats.evaluation_wait_s
                stats.turns_generated += job.stats.turns_generated
        return stats


_generation_queue: queue.SimpleQueue | None = None
_generation_start = threading.Lock()


def on_generation_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` on the process's generation thread, started on first use and never ended
    (a daemon: it holds CUDA graphs for as long as the process may generate)."""
    global _generation_queue
    with _generation_start:
        if _generation_queue is None:
            _generation_queue = queue.SimpleQueue()
            threading.Thread(
                target=_serve_generation, args=(_generation_queue,), name="generation", daemon=True
            ).start()
    call: Future = Future()
    _generation_queue.put((call, fn, args))
    return call.result()


def _serve_generation(calls: queue.SimpleQueue) -> None:
    while True:
        call, fn, args = calls.get()
        try:
            call.set_result(fn(*args))
        except BaseException as exc:  # raised again in the calling thread
            call.set_exception(exc)
