"""RayPool: the evaluation pool on a Ray cluster, one actor per GPU, across nodes.

Same interface as ``LocalPool``: ``submit(tasks, solutions) -> futures``, ``evaluate``,
``await aevaluate``, ``close``, ``num_slots``. What it adds:

- **Workers.** One ``EvalWorker`` actor per GPU (``num_gpus=1``) owns an ``Evaluator`` for that
  GPU; ``per_gpu`` evaluations are in flight on it, so one compiles and checks while another is
  timed (timing holds the Evaluator's GPU lock). On a machine without GPUs the pool starts a
  local cluster with *logical* GPUs (``ray.init(num_gpus=N)``) and the actors evaluate on CPU
  under the Triton interpreter: the same code paths, scheduling and fault handling as on GPUs.
- **Pre-check stage (optional).** ``precheck_workers`` CPU actors (``num_cpus=1``, no GPU) run
  the pure-AST stages, parse and static integrity checks, first. A completion that fails them is
  answered there (``format_error`` / ``integrity_violation``) and never occupies a GPU slot; in
  RL, early in training, that is a large share of completions. GPU workers still repeat the
  checks (cheap), so a pre-check worker that is down only costs the shortcut, never safety.
- **Scheduling.** Each batch is ordered longest-first by expected cost (median wall time of
  past evaluations of the task, from this pool and from the results store; else proportional to
  source size) and every free slot takes the next item, on the least-loaded worker: the LPT rule,
  which keeps all GPUs busy until the end of a batch. Batches are served in submission order.
- **Fault tolerance.** Actors restart (``max_restarts``). When a worker dies mid-evaluation,
  its in-flight evaluations go back to the queue and run on a live worker, each *alone* on its
  worker from then on: with ``per_gpu`` evaluations in flight a death cannot be blamed on one of
  them, run alone it can. An evaluation whose worker dies more than ``max_retries`` times is
  answered as ``runtime_error`` with the causes; an innocent one, retried alone, succeeds.
  A worker that does not answer within ``timeout_s + eval_margin_s`` is restarted the same way.
  A worker whose restarts are exhausted is replaced by a fresh actor (``max_replacements``).
  Every submitted item resolves its future exactly once: only the dispatcher thread resolves,
  and a late answer for an item already resolved is dropped.
- **Harness errors.** An evaluation answered ``harness_error`` (kernelrl's harness failed, not
  the solution) is queued once more and evaluated from scratch, on any worker; a second
  ``harness_error`` is the answer, marked as retried (``sandbox["harness_retries"]``), and like
  every harness_error it is never served from a results cache. ``stats()["harness_retried"]``.
- **Backpressure and deadlines.** ``submit`` blocks while ``max_pending`` items are unresolved
  (queued or running); ``batch_timeout_s`` (per pool or per ``submit``) answers whatever is not
  done by then as ``timeout``. Results the pool made up itself (worker deaths, deadlines) carry
  ``sandbox["pool_error"]`` and are never served from a results cache. Every result the pool
  hands back records ``phase_seconds["pool_queue"]`` (waiting for a slot) and
  ``phase_seconds["pool_overhead"]`` (round trip to the worker beyond the evaluation itself).
- **Shutdown.** ``close()`` lets queued and running evaluations finish (or answers them as
  ``runtime_error`` after ``close(timeout_s)``), then stops the actors, and the local Ray
  instance if this pool started it.

Futures resolve on the dispatcher thread: a done-callback must not block on ``submit``.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import hashlib
import heapq
import itertools
import logging
import os
import signal
import statistics
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from kernelrl.env.evaluator import EvalConfig
from kernelrl.env.pool import is_harness_error, retried_harness_error
from kernelrl.env.pools import EVALS_PER_GPU
from kernelrl.env.result import EvalResult, Status
from kernelrl.env.submit_api import EvaluateFromSubmit
from kernelrl.env.task import Task, TaskError

log = logging.getLogger(__name__)

POOL_ERROR_KEY = "pool_error"  # same key as kernelrl.env.store.POOL_ERROR_KEY
_DEFAULT_SECONDS_PER_CHAR = 1e-3  # cost of an unknown task before anything was measured


# ---------------------------------------------------------------------------------- actors
class EvalWorker:
    """Ray actor body: one Evaluator on the GPU Ray assigned to this actor.

    Ray is told not to narrow ``CUDA_VISIBLE_DEVICES`` for this actor: the Evaluator's sandbox
    children pick their GPU by index, so the actor passes the index of its assigned GPU among
    the node's visible GPUs (with a narrowed variable every actor's children would use GPU 0).
    """

    def __init__(self, config: EvalConfig, store_path: str | None = None) -> None:
        import ray

        from kernelrl.env.evaluator import Evaluator

        self.gpu_ids = [str(g) for g in ray.get_gpu_ids()]
        gpu_index = 0
        if self.gpu_ids:
            visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v]
            first = self.gpu_ids[0]
            gpu_index = visible.index(first) if first in visible else int(first)
        timing_cache = None
        if store_path:
            from kernelrl.env.store import ResultsStore

            timing_cache = ResultsStore(store_path).reference_timings()
        self.evaluator = Evaluator(config, gpu_index=gpu_index, timing_cache=timing_cache)
        self.evaluator.warm()
        self.node = ray.get_runtime_context().get_node_id()
        self.started = time.time()

    def info(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "node": self.node,
            "gpu_ids": self.gpu_ids,
            "device": self.evaluator.device_kind,
            "device_name": self.evaluator.device_name,
            "versions": self.evaluator.versions,
            "started": self.started,
        }

    def ping(self) -> int:
        return os.getpid()

    def evaluate(self, task: Task, solution: str) -> tuple[str, Any]:
        """("ok", EvalResult) | ("task_error", message) | ("error", message): exceptions are
        returned, not raised, so that only a dead actor shows up as a Ray error."""
        try:
            return "ok", self.evaluator.evaluate(task, solution)
        except TaskError as exc:
            return "task_error", str(exc)
        except Exception as exc:
            return "error", f"{type(exc).__name__}: {exc}"

    def close(self) -> None:
        """Stop warm children, and kill the ones still running a solution with all they
        spawned (a compiler, say): each leads its own process group, which the kernel's death
        signal at the actor's exit would not reach beyond the child itself."""
        self.evaluator.close()
        _kill_child_process_groups()


class PrecheckWorker:
    """Ray actor body: parse and static integrity checks, pure AST, no GPU, no execution."""

    def check(
        self, backend: str, task_source: str, completion: str, static: bool
    ) -> tuple[str, str, list[str]] | None:
        """None when the completion passed; else (status, error, failed check names), the
        same verdict the Evaluator would reach at these stages."""
        from kernelrl.env.parse import FormatError, extract_solution
        from kernelrl.env.static_checks import run_static_checks

        try:
            source = extract_solution(completion)
        except FormatError as exc:
            return str(Status.FORMAT_ERROR), str(exc), []
        failures = run_static_checks(source, backend, task_source) if static else []
        if failures:
            error = "\n".join(f"[{f.name}] {f.message}" for f in failures)
            return str(Status.INTEGRITY_VIOLATION), error, sorted({f.name for f in failures})
        return None

    def ping(self) -> int:
        return os.getpid()


# ---------------------------------------------------------------------------------- driver
@dataclass
class _Item:
    seq: int
    batch: int
    task: Task
    solution: str
    future: Future
    cost: float
    deadline: float | None  # monotonic batch deadline
    submitted: float = field(default_factory=time.monotonic)
    attempts: int = 0  # worker failures while this item was on the worker
    hung: bool = False  # the last failure was a worker that stopped answering
    causes: list[str] = field(default_factory=list)
    done: bool = False
    alone: bool = False  # after a worker died under it: runs with nothing else on its worker
    harness_first: EvalResult | None = None  # its first answer, when that was a harness_error

    def sort_key(self) -> tuple[int, float, int]:
        return (self.batch, -self.cost, self.seq)


@dataclass
class _Worker:
    index: int
    kind: str  # "gpu" or "cpu"
    handle: Any
    slots: int
    in_flight: dict[Any, _Item] = field(default_factory=dict)
    healthy: bool = False
    probe: Any = None  # ObjectRef of a ping while not healthy
    probe_after: float = 0.0
    dead: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    completed: int = 0
    deaths: int = 0
    incarnation: int = 0  # bumped at each counted death: older calls' failures are that death
    load: float = 0.0  # expected seconds of work in flight

    def free(self) -> int:
        if not self.healthy or self.dead or any(i.alone for i in self.in_flight.values()):
            return 0
        return self.slots - len(self.in_flight)

    def idle(self) -> bool:
        return self.healthy and not self.dead and not self.in_flight

    @property
    def awaiting_probe(self) -> bool:
        """Down, not given up, and no ping out: the dispatcher owes it one (even when idle)."""
        return not self.healthy and not self.dead and self.probe is None


@dataclass
class _Call:
    worker: _Worker
    item: _Item
    kind: str  # "eval" or "check"
    started: float
    incarnation: int  # of its worker when it was sent
    collateral: bool = False  # its worker was restarted by the pool for another item


class RayPool(EvaluateFromSubmit):
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
        cluster to join ("auto" or "host:port"); without one, an already initialised Ray is
        used, else a local instance is started, declaring ``logical_gpus`` (default
        ``workers`` or 1) when this machine has no GPU. ``store_path``: a ResultsStore file the
        workers share reference timings through (on several nodes: a shared filesystem); its
        past evaluation times seed the scheduler's cost estimates. ``task_seconds``: known
        evaluation seconds per task hash, for scheduling."""
        import ray

        self.config = copy.deepcopy(config or EvalConfig())
        self.per_gpu = per_gpu
        self.max_pending = max_pending
        self.max_retries = max_retries
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
        self.config.spare_children = max(self.config.spare_children, per_gpu)
        env = dict(runtime_env or {})
        env["env_vars"] = {
            **env.get("env_vars", {}),
            "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1",
            # Ray kills a dying actor's children before the actor stops answering: an
            # evaluation whose child it killed would be answered as the solution's crash. The
            # children die with the actor instead (PR_SET_PDEATHSIG, see sandbox_child).
            "RAY_kill_child_processes_on_worker_exit": "0",
        }
        self._gpu_actor = ray.remote(EvalWorker).options(
            num_gpus=1,
            num_cpus=cpus_per_worker,
            max_restarts=max_restarts,
            max_task_retries=0,  # retries are ours: we count deaths per evaluation
            max_concurrency=per_gpu + 1,  # +1: pings are answered while per_gpu evaluate
            runtime_env=env,
        )
        self._cpu_actor = ray.remote(PrecheckWorker).options(
            num_cpus=1, num_gpus=0, max_restarts=max_restarts, max_task_retries=0,
            max_concurrency=2, runtime_env=runtime_env,
        )  # fmt: skip
        self._actor_args = (self.config, store_path)
        self._replacements_left = (
            count + precheck_workers if max_replacements is None else max_replacements
        )
        self._workers: list[_Worker] = []
        for index in range(count):
            self._workers.append(
                _Worker(index, "gpu", self._gpu_actor.remote(*self._actor_args), per_gpu)
            )
        for index in range(precheck_workers):
            self._workers.append(_Worker(count + index, "cpu", self._cpu_actor.remote(), 4))
        self._wait_ready(ready_timeout_s)

        first = self._workers[0].info
        self.device = first["device"]
        self.device_name = first["device_name"]
        self.versions = first["versions"]

        self._seconds: dict[str, float] = {}
        if store_path:  # what past runs measured on this device
            from kernelrl.env.store import ResultsStore

            with ResultsStore(store_path) as store:
                self._seconds.update(store.task_seconds(self.device_name))
        self._seconds.update(task_seconds or {})
        self._seq = itertools.count()
        self._batches = itertools.count()
        self._slots = threading.BoundedSemaphore(max_pending)
        self._cv = threading.Condition()
        self._incoming: collections.deque[tuple[_Item, bool]] = collections.deque()
        self._gpu_queue: list[tuple[tuple[int, float, int], _Item]] = []
        self._cpu_queue: list[tuple[tuple[int, float, int], _Item]] = []
        self._calls: dict[Any, _Call] = {}
        self._probes: dict[Any, _Worker] = {}
        self._closing = False
        self._close_deadline: float | None = None
        self._stats = {"submitted": 0, "completed": 0, "retried": 0, "gave_up": 0, "worker_deaths": 0,
                       "precheck_rejected": 0, "batch_timeouts": 0, "eval_timeouts": 0,
                       "harness_retried": 0}  # fmt: skip
        self._recent: collections.deque[float] = collections.deque(maxlen=10_000)
        self._started = time.time()
        self._snapshot: dict[str, Any] = {}
        self._publish()
        self._dispatcher = threading.Thread(
            target=self._run, name="kernelrl-ray-dispatch", daemon=True
        )
        self._dispatcher.start()

    # ------------------------------------------------------------------ public interface
    @classmethod
    def connect(
        cls,
        name: str = "kernelrl-env",
        address: str | None = "auto",
        namespace: str = "kernelrl",
    ) -> Any:
        """A client of a running environment service (``kernelrl env serve``), found by name;
        it has the same interface as this pool."""
        from kernelrl.env.service import ServiceClient

        return ServiceClient(name=name, address=address, namespace=namespace)

    @property
    def num_slots(self) -> int:
        return sum(w.slots for w in self._workers if w.kind == "gpu")

    def actor(self, index: int) -> Any:
        """The Ray actor handle of worker ``index`` (as numbered in ``stats()``), for operators
        and fault-injection tests."""
        return self._workers[index].handle

    def submit(
        self, tasks: Sequence[Task], solutions: Sequence[str], timeout_s: float | None = None
    ) -> list[Future[EvalResult]]:
        """One future per item, in input order; blocks while ``max_pending`` are unresolved.
        ``timeout_s``: deadline for this batch (default: the pool's ``batch_timeout_s``)."""
        if self._closing:
            raise RuntimeError("pool is closed")
        if len(tasks) != len(solutions):
            raise ValueError(f"{len(tasks)} tasks but {len(solutions)} solutions")
        timeout_s = self.batch_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s if timeout_s is not None else None
        batch = next(self._batches)
        costs = self.estimate_costs(tasks, solutions)
        futures: list[Future[EvalResult]] = [Future() for _ in tasks]
        precheck = any(w.kind == "cpu" for w in self._workers)
        # Admitted longest-first, so that under backpressure the expensive ones still go first.
        for index in sorted(range(len(tasks)), key=lambda i: -costs[i]):
            self._slots.acquire()  # backpressure: released when an item resolves
            item = _Item(
                next(self._seq),
                batch,
                tasks[index],
                solutions[index],
                futures[index],
                costs[index],
                deadline,
            )
            with self._cv:
                if self._closing:  # closed while this submit waited for room
                    self._slots.release()
                    futures[index].set_exception(RuntimeError("pool is closed"))
                    continue
                self._incoming.append((item, precheck))
                self._stats["submitted"] += 1
                self._cv.notify()
        return futures

    def estimate_costs(self, tasks: Sequence[Task], solutions: Sequence[str]) -> list[float]:
        """Expected seconds per item: measured for known tasks, by source size otherwise."""
        known = dict(self._seconds)
        sizes = [len(t.source) + len(s) for t, s in zip(tasks, solutions, strict=True)]
        calibration = [
            known[t.hash] / n for t, n in zip(tasks, sizes, strict=True) if t.hash in known and n
        ]
        per_char = statistics.median(calibration) if calibration else _DEFAULT_SECONDS_PER_CHAR
        return [known.get(t.hash, n * per_char) for t, n in zip(tasks, sizes, strict=True)]

    def stats(self) -> dict[str, Any]:
        """Workers, queue depth, throughput and failures, as the dispatcher last saw them."""
        with self._cv:
            snapshot = dict(self._snapshot)
            recent = [t for t in self._recent if t > time.time() - 60]
            snapshot.update(self._stats)
            snapshot["queued"] = snapshot.get("queued", 0) + len(self._incoming)
        uptime = time.time() - self._started
        snapshot["uptime_s"] = uptime
        snapshot["throughput_per_s"] = snapshot["completed"] / uptime if uptime > 0 else 0.0
        snapshot["throughput_last_min_per_s"] = (
            len(recent) / min(60.0, uptime) if uptime > 0 else 0.0
        )
        snapshot["device_name"] = self.device_name
        return snapshot

    def close(self, timeout_s: float | None = None) -> None:
        """Finish what was submitted (answering the rest as ``runtime_error`` once ``timeout_s``
        has passed), then stop the actors and the Ray instance this pool started."""
        import ray

        if self._closing and not self._dispatcher.is_alive():
            return
        with self._cv:
            self._closing = True
            self._close_deadline = time.monotonic() + timeout_s if timeout_s is not None else None
            self._cv.notify()
        self._dispatcher.join()
        closes = [w.handle.close.remote() for w in self._workers if w.kind == "gpu" and not w.dead]
        ray.wait(closes, num_returns=len(closes), timeout=30)  # a dead one simply errs
        for worker in self._workers:
            with contextlib.suppress(Exception):
                ray.kill(worker.handle, no_restart=True)
        self._shutdown_ray()

    def __enter__(self) -> RayPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ worker life
    def _wait_ready(self, timeout_s: float) -> None:
        import ray

        refs = {
            w.handle.info.remote() if w.kind == "gpu" else w.handle.ping.remote(): w
            for w in self._workers
        }
        ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
        try:
            if pending:
                raise RuntimeError(
                    f"{len(pending)} of {len(refs)} Ray workers were not ready after {timeout_s:.0f} s"
                    f" (cluster resources: {ray.available_resources()})"
                )
            for ref in ready:
                worker = refs[ref]
                value = ray.get(ref)
                worker.info = value if isinstance(value, dict) else {"pid": value}
                worker.healthy = True
        except Exception:
            for worker in self._workers:
                ray.kill(worker.handle, no_restart=True)
            self._shutdown_ray()
            raise

    def _shutdown_ray(self) -> None:
        import ray

        if self._started_ray and ray.is_initialized():
            ray.shutdown()
            self._started_ray = False

    def _worker_failed(self, worker: _Worker, cause: str) -> None:
        """Stop sending work to it and ping it until Ray has restarted it (or it is gone).
        Called once per death: the failures of the other calls it had in flight (and of calls
        sent before the pool knew) belong to the same incarnation and are not counted again."""
        worker.incarnation += 1
        if worker.healthy:
            worker.deaths += 1
            self._stats["worker_deaths"] += 1
            log.warning("kernelrl ray worker %d failed: %s", worker.index, cause.splitlines()[0])
        worker.healthy = False
        if worker.probe is None and not worker.dead:
            worker.probe_after = time.monotonic()

    def _probe(self, now: float) -> None:
        if self._closing and not (self._gpu_queue or self._cpu_queue or self._calls):
            return  # nothing left that a restarted worker would do
        for worker in self._workers:
            if worker.awaiting_probe and now >= worker.probe_after:
                handle = worker.handle
                worker.probe = (
                    handle.info.remote() if worker.kind == "gpu" else handle.ping.remote()
                )
                self._probes[worker.probe] = worker

    def _probe_answered(self, ref: Any, worker: _Worker) -> None:
        import ray
        from ray.exceptions import ActorDiedError, RayError

        worker.probe = None
        try:
            value = ray.get(ref)
        except ActorDiedError:
            self._replace(worker)
            return
        except RayError:  # restarting: try again shortly
            worker.probe_after = time.monotonic() + 0.5
            return
        worker.info = value if isinstance(value, dict) else {"pid": value}
        worker.healthy = True
        log.info("kernelrl ray worker %d is back (pid %s)", worker.index, worker.info.get("pid"))

    def _replace(self, worker: _Worker) -> None:
        """Restarts exhausted (or its node is gone): a fresh actor takes its place."""
        import ray

        if self._replacements_left <= 0 or self._closing:
            worker.dead = True
            if not self._closing:
                log.error("kernelrl ray worker %d is gone and no replacement is left", worker.index)
            return
        self._replacements_left -= 1
        log.warning("kernelrl ray worker %d is gone for good: starting a replacement", worker.index)
        with contextlib.suppress(Exception):
            ray.kill(worker.handle, no_restart=True)
        worker.handle = (
            self._gpu_actor.remote(*self._actor_args)
            if worker.kind == "gpu"
            else self._cpu_actor.remote()
        )
        worker.probe_after = time.monotonic()  # its first ping waits for the constructor

    # ------------------------------------------------------------------ dispatcher
    def _run(self) -> None:
        try:
            while self._step():
                pass
        except BaseException as exc:  # never leave a future hanging, whatever broke
            log.exception("kernelrl ray dispatcher failed")
            self._fail_everything(f"the pool's dispatcher failed: {type(exc).__name__}: {exc}")

    def _step(self) -> bool:
        import ray

        with self._cv:
            while self._incoming:
                item, precheck = self._incoming.popleft()
                queue = self._cpu_queue if precheck else self._gpu_queue
                heapq.heappush(queue, (item.sort_key(), item))
            closing = self._closing
            idle = not (self._calls or self._probes or self._gpu_queue or self._cpu_queue)
            if idle and closing:
                return False
            if idle and not any(w.awaiting_probe for w in self._workers):
                self._cv.wait(0.1)
                return True
        now = time.monotonic()
        self._expire(now, closing)
        self._probe(now)
        self._dispatch(now)

        refs = list(self._calls) + list(self._probes)
        if not refs:
            if not self._any_worker_alive():
                self._fail_everything(
                    "no evaluation workers are left (all died, replacements exhausted)"
                )
            self._publish()
            with self._cv:
                self._cv.wait(0.05)
            return True
        ready, _ = ray.wait(refs, num_returns=1, timeout=0.05)
        if ready:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in ready:
            if ref in self._probes:
                self._probe_answered(ref, self._probes.pop(ref))
            else:
                self._answered(ref, self._calls.pop(ref))
        self._publish()
        return True

    def _dispatch(self, now: float) -> None:
        for kind, queue in (("cpu", self._cpu_queue), ("gpu", self._gpu_queue)):
            workers = [w for w in self._workers if w.kind == kind]
            if kind == "cpu" and queue and not any(not w.dead for w in workers):
                while queue:  # no pre-check worker left: the GPU workers check anyway
                    _, item = heapq.heappop(queue)
                    heapq.heappush(self._gpu_queue, (item.sort_key(), item))
                continue
            while queue:
                free = [w for w in workers if w.free() > 0]
                if not free:
                    break
                _, item = heapq.heappop(queue)
                if item.done:
                    continue
                if not item.future.running() and not item.future.set_running_or_notify_cancel():
                    self._resolved(item)  # cancelled by the caller before it started
                    continue
                if item.alone and kind == "gpu":
                    idle = [w for w in free if w.idle()]
                    if not idle:  # wait for a worker to drain; it goes first then
                        heapq.heappush(queue, (item.sort_key(), item))
                        break
                    free = idle
                worker = min(free, key=lambda w: (w.load, len(w.in_flight), w.index))
                if kind == "gpu":
                    ref = worker.handle.evaluate.remote(item.task, item.solution)
                else:
                    ref = worker.handle.check.remote(
                        item.task.backend,
                        item.task.source,
                        item.solution,
                        self.config.static_checks,
                    )
                worker.in_flight[ref] = item
                worker.load += item.cost
                self._calls[ref] = _Call(
                    worker, item, "eval" if kind == "gpu" else "check", now, worker.incarnation
                )

    def _answered(self, ref: Any, call: _Call) -> None:
        import ray
        from ray.exceptions import RayError

        worker, item = call.worker, call.item
        worker.in_flight.pop(ref, None)
        worker.load = max(worker.load - item.cost, 0.0)
        try:
            value = ray.get(ref)
        except RayError as exc:  # the actor died or is unreachable: not the item's verdict
            if call.incarnation == worker.incarnation:  # else: a death already counted
                self._worker_failed(worker, str(exc))
            if call.kind == "check":
                self._requeue(item, gpu=True)  # the GPU worker repeats the checks
                return
            if not call.collateral:
                item.attempts += 1
                item.hung = False
                pid = worker.info.get("pid", "?")
                item.causes.append(
                    f"worker {worker.index} (pid {pid}) died: {type(exc).__name__}:"
                    f" {_first_lines(str(exc), 1)}"
                )
                item.alone = True
            self._retry_or_give_up(item, Status.TIMEOUT if item.hung else Status.RUNTIME_ERROR)
            return
        worker.completed += 1
        if call.kind == "check":
            if value is None:
                self._requeue(item, gpu=True)
            else:
                self._stats["precheck_rejected"] += 1
                self._finish(item, self._precheck_result(item, *value))
            return
        tag, payload = value
        if tag == "ok" and is_harness_error(payload) and item.harness_first is None:
            # Our harness failed, not the solution: evaluate it once more from scratch (a fresh
            # child, on whichever worker is free); a second harness_error is the answer.
            self._stats["harness_retried"] += 1
            item.harness_first = payload
            log.warning(
                "harness_error on %s from worker %d, evaluating once more: %s",
                item.task.id,
                worker.index,
                _first_lines(payload.error, 1),
            )
            self._requeue(item, gpu=True)
            return
        if tag == "ok":
            if item.harness_first is not None:
                payload = retried_harness_error(item.harness_first, payload)
            # What the pool added: time queued before a slot took it, and the round trip to
            # the worker beyond the evaluation itself (scheduling, Ray RPC, serialisation).
            payload.phase_seconds["pool_queue"] = call.started - item.submitted
            round_trip = time.monotonic() - call.started
            payload.phase_seconds["pool_overhead"] = max(
                round_trip - payload.phase_seconds.get("total", 0.0), 0.0
            )
            seconds = payload.phase_seconds.get("total", item.cost)
            previous = self._seconds.get(item.task.hash, seconds)
            self._seconds[item.task.hash] = 0.5 * previous + 0.5 * seconds
            self._finish(item, payload)
        elif tag == "task_error":
            self._finish(item, error=TaskError(payload))
        else:
            self._finish(
                item, error=RuntimeError(f"evaluation failed in worker {worker.index}: {payload}")
            )

    def _retry_or_give_up(self, item: _Item, status: Status) -> None:
        if item.done:
            return
        if item.attempts <= self.max_retries:
            self._stats["retried"] += 1
            self._requeue(item, gpu=True)
            return
        self._stats["gave_up"] += 1
        causes = "\n".join(f"- {cause}" for cause in item.causes[-3:])
        alone = item.attempts - 1  # retries run with nothing else on their worker
        blame = (
            f", {alone} of them with nothing else running on it: the solution itself crashes,"
            " kills or hangs its worker"
            if alone
            else ""
        )
        error = (
            f"the evaluation worker was lost {item.attempts} times while evaluating this"
            f" solution{blame}\n{causes}"
        )
        self._finish(item, self._made_up_result(item, status, error, "worker_failed"))

    def _requeue(self, item: _Item, gpu: bool) -> None:
        if not item.done:
            heapq.heappush(self._gpu_queue if gpu else self._cpu_queue, (item.sort_key(), item))

    def _expire(self, now: float, closing: bool) -> None:
        """Batch deadlines, hung workers, and the close deadline."""
        import ray

        force_close = closing and self._close_deadline is not None and now > self._close_deadline
        for queue in (self._gpu_queue, self._cpu_queue):
            for _, item in queue:
                self._check_deadline(item, now, force_close)
        if force_close:  # answer what runs too; the actors are killed next
            for call in self._calls.values():
                self._check_deadline(call.item, now, force_close)
            self._gpu_queue.clear()
            self._cpu_queue.clear()
            self._calls.clear()
            self._probes.clear()
            return
        for ref, call in list(self._calls.items()):
            self._check_deadline(call.item, now, force_close)
            if call.kind != "eval" or call.collateral or now - call.started <= self.eval_timeout_s:
                continue
            # The Evaluator enforces timeout_s on the solution itself; past the margin the
            # worker is stuck: restart it; the stuck item counts a failure, the others do not.
            self._stats["eval_timeouts"] += 1
            call.item.attempts += 1
            call.item.hung = True
            call.item.alone = True
            call.item.causes.append(
                f"the worker did not answer within {self.eval_timeout_s:.0f} s and was restarted"
            )
            for other_ref, other in self._calls.items():
                if other.worker is call.worker:
                    other.collateral = other_ref != ref
            call.collateral = True  # its failure is already counted above
            self._worker_failed(call.worker, "evaluation deadline passed")
            ray.kill(call.worker.handle, no_restart=False)

    def _check_deadline(self, item: _Item, now: float, force_close: bool) -> None:
        if item.done:
            return
        if force_close:
            error = "the pool was closed before this evaluation finished"
            self._finish(item, self._made_up_result(item, Status.RUNTIME_ERROR, error, "closed"))
        elif item.deadline is not None and now > item.deadline:
            self._stats["batch_timeouts"] += 1
            error = f"the batch deadline passed after {now - item.submitted:.0f} s before this evaluation finished"
            self._finish(item, self._made_up_result(item, Status.TIMEOUT, error, "batch_timeout"))

    def _finish(
        self, item: _Item, result: EvalResult | None = None, error: BaseException | None = None
    ) -> None:
        """The one place an item resolves: exactly once, whatever answers arrive later."""
        if item.done:
            return
        if not item.future.done():
            if error is not None:
                item.future.set_exception(error)
            else:
                item.future.set_result(result)
        self._stats["completed"] += 1
        self._recent.append(time.time())
        self._resolved(item)

    def _resolved(self, item: _Item) -> None:
        if not item.done:
            item.done = True
            self._slots.release()

    def _fail_everything(self, reason: str) -> None:
        items = [i for _, i in self._gpu_queue + self._cpu_queue] + [
            c.item for c in self._calls.values()
        ]
        with self._cv:
            items += [i for i, _ in self._incoming]
            self._incoming.clear()
        self._gpu_queue.clear()
        self._cpu_queue.clear()
        self._calls.clear()
        for item in items:
            self._finish(
                item, self._made_up_result(item, Status.RUNTIME_ERROR, reason, "no_workers")
            )

    def _any_worker_alive(self) -> bool:
        return any(not w.dead for w in self._workers if w.kind == "gpu")

    def _publish(self) -> None:
        workers = [
            {
                "index": w.index,
                "kind": w.kind,
                "state": "dead" if w.dead else "ok" if w.healthy else "restarting",
                "in_flight": len(w.in_flight),
                "completed": w.completed,
                "deaths": w.deaths,
                "gpu_ids": w.info.get("gpu_ids", []),
                "node": w.info.get("node", ""),
                "pid": w.info.get("pid"),
            }
            for w in self._workers
        ]
        snapshot = {
            "workers": workers,
            "queued": len(self._gpu_queue) + len(self._cpu_queue),
            "in_flight": len(self._calls),
        }
        with self._cv:
            self._snapshot = snapshot

    # ------------------------------------------------------------------ made-up results
    def _base_result(self, item: _Item, status: Status) -> EvalResult:
        return EvalResult(
            task_id=item.task.id,
            backend=item.task.backend,
            status=status,
            device=self.device,
            device_name=self.device_name,
            versions=dict(self.versions),
            task_hash=item.task.hash,
            solution_hash=hashlib.sha256(item.solution.encode()).hexdigest()[:16],
            timestamp=time.time(),
        )

    def _precheck_result(
        self, item: _Item, status: str, error: str, checks: list[str]
    ) -> EvalResult:
        from kernelrl.env.feedback import build_feedback

        result = self._base_result(item, Status(status))
        result.error, result.checks_failed = error, checks
        result.phase_seconds = {
            "precheck": time.monotonic() - item.submitted,
            "total": time.monotonic() - item.submitted,
        }
        result.feedback = build_feedback(result)
        return result

    def _made_up_result(self, item: _Item, status: Status, error: str, reason: str) -> EvalResult:
        """A verdict of the pool, not of the sandbox: marked so caches never reuse it."""
        from kernelrl.env.feedback import build_feedback

        result = self._base_result(item, status)
        result.error = error
        result.sandbox = {POOL_ERROR_KEY: reason, "attempts": item.attempts}
        result.phase_seconds = {"total": time.monotonic() - item.submitted}
        result.feedback = build_feedback(result)
        return result


def _kill_child_process_groups() -> None:
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:  # ppid; a sandbox child leads its own group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(entry), signal.SIGKILL)


def _first_lines(text: str, lines: int = 2) -> str:
    return " ".join(line.strip() for line in text.strip().splitlines()[:lines])


def init_ray(
    address: str | None,
    namespace: str | None,
    logical_gpus: int | None,
    workers: int | None,
    cpu_workers: int,
) -> bool:
    """Join ``address``, reuse an initialised Ray, or start a local one (with ``logical_gpus``,
    default ``workers`` or 1, on a machine without GPUs). True if this call connected or
    started Ray (the caller then shuts it down)."""
    import ray

    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"namespace": namespace, "log_to_driver": False}
    if address and address != "local":
        ray.init(address=address, **kwargs)
        return True  # disconnects on close; the cluster itself lives on
    # "local", not None: ray.init() without an address joins a cluster it finds on this machine
    # (RAY_ADDRESS, or the last `ray start`); a pool without an address must start its own.
    import torch

    if logical_gpus is None and not torch.cuda.is_available():
        logical_gpus = workers or 1
    if logical_gpus is not None:
        kwargs["num_gpus"] = logical_gpus
    # Logical CPUs: every actor fits even on a 2-core machine (the OS shares the cores).
    kwargs["num_cpus"] = max(os.cpu_count() or 1, (workers or logical_gpus or 1) + cpu_workers)
    ray.init(address="local", include_dashboard=False, **kwargs)
    return True
