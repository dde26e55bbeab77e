"""Which evaluation runs next, and on which worker: the part of the Ray pool that is ours (and
the order LocalPool takes a batch in: ``CostModel.longest_first``).

Pure bookkeeping, no Ray and no clock, so that tests drive every decision directly.

- **Longest-first.** Queued jobs are taken in order of (batch, expected cost descending,
  submission): batches in submission order, and within a batch the most expensive first, each
  on the least-loaded worker with a free slot - the LPT rule, which keeps every worker busy
  until the end of a batch instead of leaving one long evaluation for last.
- **Blame isolation.** A worker runs several evaluations at once; when it dies, any of them may
  have killed it. Each one that was in flight is rerun *alone* - on an idle worker, with nothing
  else placed beside it - so a second death is that job's own doing: after ``max_retries``
  blamed deaths it is given up (the pool answers it as the solution's failure), while an
  innocent neighbour, rerun alone, simply succeeds. A job that lost its worker through no
  fault of its own (the pool restarted that worker for another job) is requeued unblamed.
"""

from __future__ import annotations

import heapq
import itertools
import statistics
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kernelrl.env.task import Task

# Expected seconds per character of task + solution source before anything was measured.
DEFAULT_SECONDS_PER_CHAR = 1e-3


class CostModel:
    """Expected evaluation seconds: what was measured for the task (an exponential average of
    its evaluations), else proportional to the size of task and solution sources, at the rate
    the measured tasks show (``DEFAULT_SECONDS_PER_CHAR`` before any)."""

    def __init__(self, seconds: dict[str, float] | None = None) -> None:
        self.seconds = dict(seconds or {})  # task hash -> seconds

    def estimate(self, jobs: Sequence[tuple[str, int]]) -> list[float]:
        """Seconds for each (task hash, source characters)."""
        known = self.seconds
        rates = [known[h] / size for h, size in jobs if h in known and size]
        per_char = statistics.median(rates) if rates else DEFAULT_SECONDS_PER_CHAR
        return [known.get(h, size * per_char) for h, size in jobs]

    def longest_first(
        self, tasks: Sequence[Task], solutions: Sequence[str]
    ) -> list[tuple[int, float]]:
        """(index, expected seconds) of every item of a batch, the most expensive first, ties in
        submission order: a batch taken in this order leaves no long evaluation for last."""
        costs = self.estimate(
            [(t.hash, len(t.source) + len(s)) for t, s in zip(tasks, solutions, strict=True)]
        )
        return sorted(enumerate(costs), key=lambda item: -item[1])

    def observe(self, task_hash: str, seconds: float) -> None:
        previous = self.seconds.get(task_hash, seconds)
        self.seconds[task_hash] = 0.5 * previous + 0.5 * seconds


@dataclass(eq=False)
class Job:
    """One evaluation to place. ``payload``: whatever the pool evaluates (opaque here)."""

    key: int
    batch: int
    cost: float
    payload: Any = None
    attempts: int = 0  # deaths of its worker blamed on it
    causes: list[str] = field(default_factory=list)
    alone: bool = False  # runs with nothing beside it (once a worker died under it)
    worker: Hashable | None = None  # where it runs now
    queued: bool = False
    ticket: int = -1  # of its live queue entry; entries left by a withdraw are skipped

    def order(self) -> tuple[int, float, int]:
        return (self.batch, -self.cost, self.key)


@dataclass(eq=False)
class _Worker:
    slots: int
    rank: int  # registration order, the last tie-break
    up: bool = True
    running: set[Job] = field(default_factory=set)
    load: float = 0.0  # expected seconds of work on it

    def free(self) -> int:
        if not self.up or any(job.alone for job in self.running):
            return 0
        return self.slots - len(self.running)

    def idle(self) -> bool:
        return self.up and not self.running


class Scheduler:
    def __init__(self, max_retries: int = 2) -> None:
        """``max_retries``: blamed deaths a job survives; one more and it is given up."""
        self.max_retries = max_retries
        self._workers: dict[Hashable, _Worker] = {}
        self._heap: list[tuple[tuple[int, float, int], int, Job]] = []
        self._tickets = itertools.count()
        self.queued = 0

    # ---------------------------------------------------------------------------- workers
    def add_worker(self, worker: Hashable, slots: int) -> None:
        self._workers[worker] = _Worker(slots, len(self._workers))

    def set_up(self, worker: Hashable, up: bool, slots: int | None = None) -> None:
        """A worker that is down (dead, restarting) gets nothing new; one back up may come
        with other ``slots`` (a replacement sized on another node)."""
        self._workers[worker].up = up
        if slots is not None:
            self._workers[worker].slots = slots

    def in_flight(self, worker: Hashable) -> int:
        return len(self._workers[worker].running)

    @property
    def running(self) -> int:
        return sum(len(w.running) for w in self._workers.values())

    # ---------------------------------------------------------------------------- jobs
    def push(self, job: Job) -> None:
        """Queue a job: new, requeued after a lost worker, or evaluated once more."""
        if job.queued:
            return
        job.queued = True
        job.ticket = next(self._tickets)
        self.queued += 1
        heapq.heappush(self._heap, (job.order(), job.ticket, job))

    def withdraw(self, job: Job) -> bool:
        """Take a queued job out (its deadline passed, the caller gave up); False if it was not
        queued (running, or gone)."""
        if not job.queued:
            return False
        job.queued = False
        self.queued -= 1
        return True

    def clear(self) -> list[Job]:
        """Every queued job, taken out (no worker is left, or the pool closes)."""
        jobs = [job for _, ticket, job in self._heap if job.queued and job.ticket == ticket]
        for job in jobs:
            job.queued = False
        self._heap.clear()
        self.queued = 0
        return jobs

    def assign(self) -> list[tuple[Job, Hashable]]:
        """Place queued jobs on free slots, longest-first on the least-loaded worker. A job that
        must run alone waits for an idle worker, and nothing behind it is placed meanwhile: the
        workers drain, and it takes the first one that does."""
        placed: list[tuple[Job, Hashable]] = []
        while self._heap:
            _, ticket, job = self._heap[0]
            if not job.queued or job.ticket != ticket:
                heapq.heappop(self._heap)
                continue
            free = [(w, s) for w, s in self._workers.items() if s.free() > 0]
            if job.alone:
                free = [(w, s) for w, s in free if s.idle()]
            if not free:
                break
            worker, slots = min(free, key=lambda ws: (ws[1].load, len(ws[1].running), ws[1].rank))
            heapq.heappop(self._heap)
            job.queued = False
            self.queued -= 1
            job.worker = worker
            slots.running.add(job)
            slots.load += job.cost
            placed.append((job, worker))
        return placed

    def release(self, job: Job) -> None:
        """The job left its worker: answered, or its answer is no longer wanted."""
        if job.worker is None:
            return
        slots = self._workers[job.worker]
        slots.running.discard(job)
        slots.load = max(slots.load - job.cost, 0.0) if slots.running else 0.0
        job.worker = None

    def lost(self, job: Job, cause: str | None) -> bool:
        """The job's worker died (or was restarted) under it. ``cause`` None: not the job's
        doing (the pool restarted its worker for another job), so it is requeued as it was.
        Otherwise the death is blamed on it: it reruns alone from now on, unless this was one
        death more than ``max_retries`` - False then: give it up."""
        self.release(job)
        if cause is not None:
            job.attempts += 1
            job.causes.append(cause)
            job.alone = True
            if job.attempts > self.max_retries:
                return False
        self.push(job)
        return True


def blame(job: Job) -> str:
    """Why a given-up job failed, for its verdict: how often its worker was lost, how many of
    those times it ran alone (then the solution itself did it), and the last causes."""
    alone = job.attempts - 1  # every rerun after the first loss ran alone
    said = (
        f", {alone} of them with nothing else running on it: the solution itself crashes,"
        " kills or hangs its worker"
        if alone
        else ""
    )
    causes = "\n".join(f"- {cause}" for cause in job.causes[-3:])
    return (
        f"the evaluation worker was lost {job.attempts} times while evaluating this"
        f" solution{said}\n{causes}"
    )
