"""RayPool: the evaluation pool on a Ray cluster, one actor per GPU, across nodes.

Ray does what Ray does: actors pinned to GPUs (``num_gpus=1``), restarted when they die
(``max_restarts``), calls to a restarting actor held until it is back, results as awaitables
(the pool is one event loop over them). The pool's own part is small (``scheduler``): which
evaluation runs next and where (longest-first), and blame isolation when a worker dies.

- **Workers** (``ray_workers``): one async ``EvalWorker`` per GPU, ``per_gpu`` evaluations in
  flight (by default each actor sizes them from its own node); without GPUs, a local Ray with
  *logical* GPUs whose actors evaluate on CPU under the Triton interpreter (same code paths). ``precheck_workers`` CPU actors run parse and static
  checks first, so a completion failing them takes no GPU slot (GPU workers check too).
- **Faults.** Ray does not retry a call whose GPU worker died (``max_task_retries=0``): a blind
  retry would rerun a worker-killing solution beside innocent ones. What was in flight reruns
  *alone*; a solution that kills its worker ``max_retries`` + 1 times is answered
  ``runtime_error`` with the causes. A worker silent past ``timeout_s + eval_margin_s`` is killed
  and restarted the same way (given up as ``timeout``); one that stays dead is replaced
  (``max_replacements``). A ``harness_error`` is evaluated once more, from scratch.
- **Backpressure, deadlines, cancellation.** ``submit`` blocks while ``max_pending`` items are
  unresolved; ``batch_timeout_s`` (per pool or per ``submit``) answers what is not done by then:
  ``timeout`` if it was running, ``harness_error`` if it still waited for a worker;
  ``close(timeout_s)`` answers what is left as ``harness_error`` (verdicts with
  ``sandbox["pool_error"]``, never cached). A future the caller cancels leaves the queue at once.
  Every result records ``phase_seconds["pool_queue"]`` and ``["pool_overhead"]``.

Every future resolves exactly once, on the pool's event-loop thread: a done-callback must not
block on ``submit``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Coroutine, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from kernelrl.env.evaluator import EvalConfig
from kernelrl.env.pools.base import EVALS_PER_GPU, SubmitPool, check_batch, own_config, settle
from kernelrl.env.pools.ray_workers import Fleet, Worker, init_ray
from kernelrl.env.pools.scheduler import CostModel, Job, Scheduler, blame
from kernelrl.env.pools.sizing import check_per_gpu
from kernelrl.env.pools.verdicts import (
    first_line,
    is_harness_error,
    pool_result,
    retried_harness_error,
)
from kernelrl.env.result import EvalResult, Status
from kernelrl.env.task import Task, TaskError

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Item:
    """What one job evaluates, and what the pool knows of it beyond the scheduler."""

    task: Task
    solution: str
    future: Future
    submitted: float  # monotonic
    deadline: float | None  # monotonic batch deadline
    harness_first: EvalResult | None = None  # its first answer, when that was a harness_error
    hung: bool = False  # the last blamed loss was a worker that stopped answering
    done: bool = False
    timer: asyncio.TimerHandle | None = None


@dataclass(eq=False)
class _Call:
    job: Job
    worker: Worker
    incarnation: int
    started: float
    collateral: bool = False  # its worker was restarted by the pool for another job
    cause: str | None = None  # set when the pool restarted its worker because of this call


class RayPool(SubmitPool):
    def __init__(
        self,
        config: EvalConfig | None = None,
        workers: int | None = None,
        per_gpu: int = EVALS_PER_GPU,
        max_pending: int = 1024,
        *,
        address: str | None = None,
        namespace: str | None = None,
        logical_gpus: int | None = None,
        precheck_workers: int = 0,
        max_retries: int = 2,
        max_restarts: int = 4,
        max_replacements: int | None = None,
        eval_margin_s: float = 120.0,
        batch_timeout_s: float | None = None,
        cpus_per_worker: float = 1.0,
        store_path: str | None = None,
        task_seconds: dict[str, float] | None = None,
        runtime_env: dict[str, Any] | None = None,
        ready_timeout_s: float = 300.0,
    ) -> None:
        """``workers``: GPU actors (default: every GPU of the cluster). ``address``: a Ray
        cluster to join ("auto", "host:port"); else an initialised Ray, else a local one with
        ``logical_gpus`` (default ``workers`` or 1) on a machine without GPUs. ``store_path``:
        a ResultsStore the workers share reference timings through; its past evaluation times
        seed the scheduler's cost estimates, as ``task_seconds`` (per task hash) do."""
        import ray

        check_per_gpu(per_gpu)
        self.config = own_config(config or EvalConfig(), per_gpu)
        self.eval_timeout_s = self.config.timeout_s + eval_margin_s
        self.batch_timeout_s = batch_timeout_s
        self._started_ray = init_ray(address, namespace, logical_gpus, workers, precheck_workers)
        gpus = int(ray.cluster_resources().get("GPU", 0))
        count = workers if workers is not None else gpus
        if count < 1 or count > gpus:
            self._shutdown_ray()
            raise ValueError(
                f"RayPool needs {count or 'at least 1'} GPU worker(s) but the cluster has {gpus}"
                " GPU(s); on a machine without GPUs start Ray with logical GPUs"
                " (ray start --num-gpus N, or let RayPool start it: logical_gpus=N)"
            )
        self._fleet = Fleet(
            count,
            (self.config, per_gpu, store_path),
            max_restarts=max_restarts,
            max_replacements=count if max_replacements is None else max_replacements,
            cpus_per_worker=cpus_per_worker,
            runtime_env=runtime_env,
        )
        try:
            first = self._fleet.start(precheck_workers, self.config.static_checks, max_restarts,
                                      runtime_env, ready_timeout_s)  # fmt: skip
        except Exception:
            self._shutdown_ray()
            raise
        self.device, self.device_name = first["device"], first["device_name"]
        self.versions: dict[str, str] = first["versions"]
        self._where = (self.device, self.device_name, self.versions)
        self._workers = self._fleet.workers

        seconds: dict[str, float] = {}
        if store_path:  # what past runs measured on this device
            from kernelrl.env.store import ResultsStore

            with ResultsStore(store_path) as store:
                seconds.update(store.task_seconds(self.device_name))
        self._costs = CostModel({**seconds, **(task_seconds or {})})
        self._scheduler = Scheduler(max_retries)
        for worker in self._workers:  # each actor's slots, given or sized from its node
            self._scheduler.add_worker(worker.index, worker.info["slots"])
        self._start_loop(max_pending)

    def _start_loop(self, max_pending: int) -> None:
        """The bookkeeping of jobs and the event-loop thread every future resolves on."""
        self._keys, self._batches = itertools.count(), itertools.count()
        self._room = threading.BoundedSemaphore(max_pending)
        self._admission = threading.Lock()
        self._closing = False
        self._unresolved: set[Job] = set()
        self._drained: asyncio.Event | None = None
        self._tasks: set[asyncio.Task] = set()
        self._prechecking = 0
        self._stats = dict.fromkeys(
            ("submitted", "completed", "retried", "gave_up", "worker_deaths", "precheck_rejected",
             "batch_timeouts", "eval_timeouts", "harness_retried", "cancelled"), 0,
        )  # fmt: skip
        self._recent: collections.deque[float] = collections.deque(maxlen=10_000)
        self._started = time.time()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kernelrl-ray-pool",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    # ------------------------------------------------------------------ public interface
    @property
    def num_slots(self) -> int:
        return sum(worker.info["slots"] for worker in self._workers)

    def actor(self, index: int) -> Any:
        """Worker ``index``'s actor handle (as in ``stats()``), for operators and fault tests."""
        return self._workers[index].handle

    def submit(
        self, tasks: Sequence[Task], solutions: Sequence[str], timeout_s: float | None = None
    ) -> list[Future[EvalResult]]:
        """One future per item, in input order; blocks while ``max_pending`` are unresolved.
        ``timeout_s``: deadline for this batch (default: the pool's ``batch_timeout_s``)."""
        if self._closing:
            raise RuntimeError("pool is closed")
        check_batch(tasks, solutions)
        timeout_s = self.batch_timeout_s if timeout_s is None else timeout_s
        now = time.monotonic()
        deadline = now + timeout_s if timeout_s is not None else None
        batch = next(self._batches)
        futures: list[Future[EvalResult]] = [Future() for _ in tasks]
        # Admitted longest-first, so that under backpressure the expensive ones still go first.
        for index, cost in self._costs.longest_first(tasks, solutions):
            self._room.acquire()  # backpressure: released when an item resolves
            item = _Item(tasks[index], solutions[index], futures[index], now, deadline)
            job = Job(next(self._keys), batch, cost, item)
            with self._admission:
                if self._closing:  # closed while this submit waited for room
                    self._room.release()
                    futures[index].set_exception(RuntimeError("pool is closed"))
                    continue
                self._loop.call_soon_threadsafe(self._admit, job)
        return futures

    def stats(self) -> dict[str, Any]:
        """Workers, queue depth, throughput and failures."""
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            return asyncio.run_coroutine_threadsafe(self._snapshot(), self._loop).result()
        return self._snapshot_now()

    def close(self, timeout_s: float | None = None) -> None:
        """Finish what was submitted (what is left after ``timeout_s``: ``harness_error``),
        then stop the actors and the Ray instance this pool started."""
        with self._admission:
            if self._closing:
                return
            self._closing = True
        asyncio.run_coroutine_threadsafe(self._drain(timeout_s), self._loop).result()
        self._fleet.close()
        asyncio.run_coroutine_threadsafe(self._cancel_tasks(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        self._shutdown_ray()

    # ------------------------------------------------------------------ one job's way
    def _admit(self, job: Job) -> None:
        item: _Item = job.payload
        self._stats["submitted"] += 1
        self._unresolved.add(job)
        if item.deadline is not None:
            item.timer = self._loop.call_at(item.deadline, self._expire, job)
        # A caller that gives up cancels its future: out of the queue, no worker, no room held.
        item.future.add_done_callback(lambda future: self._on_cancel(future, job))
        if self._fleet.checkers:
            self._spawn(self._precheck(job))
        else:
            self._scheduler.push(job)
            self._pump()

    async def _precheck(self, job: Job) -> None:
        item: _Item = job.payload
        self._prechecking += 1
        try:
            verdict = await self._fleet.check(item.task, item.solution, lambda: not item.done)
        finally:
            self._prechecking -= 1
        if item.done:
            return
        if verdict is not None:
            self._stats["precheck_rejected"] += 1
            self._resolve(job, verdict)
        else:
            self._scheduler.push(job)
            self._pump()

    def _pump(self) -> None:
        """Start what the scheduler places; answer everything when no worker is left."""
        if self._fleet.all_dead:
            why = "no evaluation workers are left (all died, replacements exhausted)"
            for job in self._scheduler.clear():
                self._resolve(job, self._verdict(job, Status.HARNESS_ERROR, why, "no_workers"))
            return
        for job, index in self._scheduler.assign():
            future = job.payload.future  # running once started: the caller can no longer cancel
            if not future.running() and not future.set_running_or_notify_cancel():
                self._scheduler.release(job)  # cancelled by the caller before it started
                if not job.payload.done:
                    self._stats["cancelled"] += 1
                self._resolve(job)
                continue
            self._spawn(self._call(job, self._workers[index]))

    async def _call(self, job: Job, worker: Worker) -> None:
        import ray

        item: _Item = job.payload
        call = _Call(job, worker, worker.incarnation, time.monotonic())
        worker.calls.add(call)
        ref = worker.handle.evaluate.remote(item.task, item.solution)
        answer = asyncio.wrap_future(ref.future())
        try:
            done, _ = await asyncio.wait({answer}, timeout=self.eval_timeout_s)
            if not done:
                self._hung(call)
            tag, payload = await answer
        except asyncio.CancelledError:  # the pool closes: nobody waits for this answer
            answer.cancel()
            raise
        except ray.exceptions.RayError as exc:  # the actor died or is unreachable
            worker.calls.discard(call)
            self._lost(call, exc)
        else:
            worker.calls.discard(call)
            self._answered(call, tag, payload)
        self._pump()

    def _answered(self, call: _Call, tag: str, payload: Any) -> None:
        job, worker, item = call.job, call.worker, call.job.payload
        self._scheduler.release(job)
        worker.completed += 1
        if item.done:  # answered already (deadline, close): the late verdict is dropped
            return
        if tag == "task_error":
            self._resolve(job, error=TaskError(payload))
            return
        if tag != "ok":
            error = RuntimeError(f"evaluation failed in worker {worker.index}: {payload}")
            self._resolve(job, error=error)
            return
        if is_harness_error(payload) and item.harness_first is None:
            # Our harness failed, not the solution: evaluate it once more from scratch (a fresh
            # child, on whichever worker is free); a second harness_error is the answer.
            self._stats["harness_retried"] += 1
            item.harness_first = payload
            log.warning("harness_error on %s from worker %d, evaluating once more: %s",
                        item.task.id, worker.index, first_line(payload.error))  # fmt: skip
            self._scheduler.push(job)
            return
        if item.harness_first is not None:
            payload = retried_harness_error(item.harness_first, payload)
        # What the pool added: time queued before a slot took it, and the round trip to the
        # worker beyond the evaluation itself (scheduling, Ray RPC, serialisation).
        seconds = payload.phase_seconds.get("total", job.cost)
        payload.phase_seconds["pool_queue"] = call.started - item.submitted
        round_trip = time.monotonic() - call.started
        payload.phase_seconds["pool_overhead"] = max(round_trip - seconds, 0.0)
        self._costs.observe(item.task.hash, seconds)
        self._resolve(job, payload)

    def _lost(self, call: _Call, exc: BaseException) -> None:
        job, worker, item = call.job, call.worker, call.job.payload
        if call.incarnation == worker.incarnation:  # else: a death already counted
            self._worker_died(worker, str(exc))
        if item.done:
            self._scheduler.release(job)
            return
        cause = call.cause
        if cause is None and not call.collateral:
            pid = worker.info.get("pid", "?")
            cause = f"worker {worker.index} (pid {pid}) died: {type(exc).__name__}: {first_line(str(exc))}"
            item.hung = False
        if self._scheduler.lost(job, None if call.collateral else cause):
            self._stats["retried"] += 1
            return
        self._stats["gave_up"] += 1
        status = Status.TIMEOUT if item.hung else Status.RUNTIME_ERROR
        self._resolve(job, self._verdict(job, status, blame(job), "worker_failed"))

    def _hung(self, call: _Call) -> None:
        """The Evaluator enforces timeout_s on the solution itself; past the margin the worker
        is stuck: restart it. The stuck job is blamed, the others on it are not."""
        if call.collateral or call.incarnation != call.worker.incarnation:
            return  # its worker is being restarted already
        self._stats["eval_timeouts"] += 1
        call.job.payload.hung = True
        call.cause = (
            f"the worker did not answer within {self.eval_timeout_s:.0f} s and was restarted"
        )
        for other in call.worker.calls:
            other.collateral = other is not call
        self._worker_died(call.worker, "evaluation deadline passed")
        self._fleet.restart(call.worker)

    def _expire(self, job: Job) -> None:
        item: _Item = job.payload
        if item.done:
            return
        self._stats["batch_timeouts"] += 1
        self._scheduler.withdraw(job)
        # Still running: its slot is freed when its late answer comes back (and is dropped).
        # Still waiting for a worker: nothing was learnt about the solution.
        running = job.worker is not None
        why = "before this evaluation finished" if running else "while it waited for a worker"
        why = f"the batch deadline passed after {time.monotonic() - item.submitted:.0f} s {why}"
        status = Status.TIMEOUT if running else Status.HARNESS_ERROR
        self._resolve(job, self._verdict(job, status, why, "batch_timeout"))

    def _on_cancel(self, future: Future, job: Job) -> None:  # on the cancelling thread
        if future.cancelled():
            with contextlib.suppress(RuntimeError):  # the pool's loop is closed: nothing left
                self._loop.call_soon_threadsafe(self._withdrawn, job)

    def _withdrawn(self, job: Job) -> None:
        """Cancelled before a worker took it (a running future cannot be): out of the queue."""
        if job.payload.done:
            return
        self._stats["cancelled"] += 1
        self._scheduler.withdraw(job)
        self._resolve(job)

    def _verdict(self, job: Job, status: Status, why: str, reason: str) -> EvalResult:
        item: _Item = job.payload
        return pool_result(item.task, item.solution, self._where, status, why, reason,
                           attempts=job.attempts, submitted=item.submitted)  # fmt: skip

    def _resolve(
        self, job: Job, result: EvalResult | None = None, error: BaseException | None = None
    ) -> None:
        """The one place a job resolves: exactly once, whatever answers arrive later."""
        item: _Item = job.payload
        if item.done:
            return
        item.done = True
        if item.timer is not None:
            item.timer.cancel()
        if result is not None or error is not None:
            settle(item.future, result, error)
        self._stats["completed"] += 1
        self._recent.append(time.time())
        self._unresolved.discard(job)
        self._room.release()
        if not self._unresolved and self._drained is not None:
            self._drained.set()

    # ------------------------------------------------------------------ worker life
    def _worker_died(self, worker: Worker, cause: str) -> None:
        """Count the death once, send it nothing new, and wait for Ray to bring it back."""
        self._stats["worker_deaths"] += 1
        self._scheduler.set_up(worker.index, False)
        if self._fleet.died(worker, cause):
            self._spawn(self._revive(worker))

    async def _revive(self, worker: Worker) -> None:
        if await self._fleet.revive(worker, lambda: self._closing):
            self._scheduler.set_up(worker.index, True, worker.info["slots"])
        self._pump()

    def _shutdown_ray(self) -> None:
        import ray

        if self._started_ray and ray.is_initialized():
            ray.shutdown()
            self._started_ray = False

    # ------------------------------------------------------------------ loop plumbing
    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        """Never leave a future hanging, whatever broke."""
        self._tasks.discard(task)
        exc = None if task.cancelled() else task.exception()
        if exc is None:
            return
        log.error("kernelrl ray pool failed", exc_info=exc)
        why = f"the pool failed: {type(exc).__name__}: {exc}"
        for job in list(self._unresolved):
            self._scheduler.withdraw(job)
            self._resolve(job, self._verdict(job, Status.HARNESS_ERROR, why, "pool_failed"))

    async def _drain(self, timeout_s: float | None) -> None:
        if self._unresolved:
            self._drained = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained.wait(), timeout_s)
        why = "the pool was closed before this evaluation finished"
        for job in list(self._unresolved):
            self._scheduler.withdraw(job)
            self._resolve(job, self._verdict(job, Status.HARNESS_ERROR, why, "closed"))

    async def _cancel_tasks(self) -> None:
        tasks = [t for t in self._tasks if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _snapshot(self) -> dict[str, Any]:
        return self._snapshot_now()

    def _snapshot_now(self) -> dict[str, Any]:
        workers = self._fleet.rows(self._scheduler.in_flight)
        uptime = time.time() - self._started
        recent = [t for t in self._recent if t > time.time() - 60]
        return {
            "workers": workers,
            "queued": self._scheduler.queued + self._prechecking,
            "in_flight": self._scheduler.running,
            **self._stats,
            "uptime_s": uptime,
            "throughput_per_s": self._stats["completed"] / uptime if uptime > 0 else 0.0,
            "throughput_last_min_per_s": len(recent) / min(60.0, uptime) if uptime > 0 else 0.0,
            "device_name": self.device_name,
        }
