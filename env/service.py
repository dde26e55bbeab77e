"""The environment service: one long-lived evaluation pool that many jobs share.

Why a service: a trainer, an evaluation sweep and a curation job that each start their own pool
pay the worker start-up each time and fight over the same GPUs. ``kernelrl env serve`` instead
starts one ``EnvService``, a *named, detached* Ray actor that owns a ``RayPool`` (and, with a
results store, a ``CachedPool`` in front of it). Jobs on any node of the cluster find it by name
(``kernelrl.env.pools.service.ServiceClient``) and use it exactly like a local pool; agents outside
Ray speak HTTP to a Ray Serve deployment in front of the same actor (``service_http``).

What the service promises the cluster it runs on (docs/threat-model.md, "The service"): every
call presents its bearer token; a client's tasks are evaluated only when the service holds them
(its own task list, matched by source and metadata), or, with ``allow_inline_tasks``, as
*untrusted* tasks whose code runs only in the sandbox and whose results stay out of the shared
results store; each client has bounded work in it (``service_clients``), all of which is
cancelled once the client is gone.

The actor hands results out one item at a time (``submit`` returns a batch id,
``result(batch, index)`` waits for one item), so a Ray client gets one future per item.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import itertools
import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from kernelrl.env.evaluator import EvalConfig
from kernelrl.env.pools.base import Pool, settle
from kernelrl.env.pools.service import NAMESPACE, SERVICE_NAME, token_digest, token_matches
from kernelrl.env.result import EvalResult
from kernelrl.env.service_clients import ClientGone, ClientLimits, Clients
from kernelrl.env.service_http import stop_http
from kernelrl.env.task import Task, TaskError, task_from_source

log = logging.getLogger(__name__)


class EnvService:
    """Ray actor body (async: thousands of clients may wait on results at once)."""

    def __init__(
        self,
        config: EvalConfig,
        pool_kwargs: dict[str, Any],
        store_path: str | None = None,
        tasks: Mapping[str, Task] | None = None,
        *,
        digest: bytes,
        limits: ClientLimits | None = None,
        allow_inline_tasks: bool = False,
    ) -> None:
        """``tasks``: the service's own tasks (trusted), which clients name by id or send by
        source. ``digest``: of the bearer token every call must present (``token_digest``).
        ``allow_inline_tasks``: evaluate other tasks a client sends too, as untrusted."""
        from kernelrl.env.pools.cached import CachedPool
        from kernelrl.env.pools.ray import RayPool
        from kernelrl.env.store import ResultsStore

        self.pool = RayPool(config, store_path=store_path, **pool_kwargs)
        self.store = ResultsStore(store_path) if store_path else None
        self.cache = CachedPool(self.pool, self.store) if self.store else None
        self.front: Pool = self.cache or self.pool
        self.tasks = dict(tasks or {})
        self._held = {_identity(task): task for task in self.tasks.values()}
        self._sources = {source for source, _ in self._held}
        self.allow_inline_tasks = allow_inline_tasks
        self.limits = limits or ClientLimits()
        self._digest = digest
        self.store_path = store_path
        self.started = time.time()
        self._executor = ThreadPoolExecutor(32, thread_name_prefix="kernelrl-service-submit")
        self.clients = Clients(self._pool_submit, self.limits, self._executor)
        self._batches: dict[int, tuple[str, dict[int, Future[EvalResult]]]] = {}
        self._ids = itertools.count()
        self._http_ids = itertools.count()
        self._sweeper: asyncio.Task | None = None
        self._clients_batches = 0
        self._http_in_flight = 0  # HTTP evaluations being answered now (0 once clients left)
        self._http_answered: dict[int, int] = {}  # HTTP status -> requests answered so far

    def _check(self, token: Any) -> None:
        if not token_matches(token, self._digest):
            raise PermissionError(
                "the environment service refused the token (read it with"
                " kernelrl.env.pools.service.read_token: $KERNELRL_ENV_TOKEN or the file that"
                " `kernelrl env serve` wrote)"
            )

    def _watch_leases(self) -> None:
        """Start the lease sweeper on the actor's loop (there is none in ``__init__``)."""
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    # ------------------------------------------------------------------ Ray clients
    async def info(self, token: str) -> dict[str, Any]:
        self._check(token)
        return {
            "device": self.pool.device,
            "device_name": self.pool.device_name,
            "versions": self.pool.versions,
            "num_slots": self.pool.num_slots,
            "workers": sum(1 for w in self.pool.stats()["workers"] if w["kind"] == "gpu"),
            "store_path": self.store_path,
            "tasks": len(self.tasks),
            "allow_inline_tasks": self.allow_inline_tasks,
            "started": self.started,
            **dataclasses.asdict(self.limits),
        }

    async def submit(
        self,
        token: str,
        client: str,
        tasks: Sequence[Task],
        solutions: Sequence[str],
        timeout_s: float | None = None,
    ) -> int:
        """Queue a batch of client ``client`` (a ServiceClient's id); waits while that client
        has ``max_client_pending`` items unresolved. A task the service does not hold (and may
        not evaluate as untrusted) fails its own item with a TaskError, not the batch."""
        self._check(token)
        self._watch_leases()
        if len(tasks) != len(solutions):
            raise ValueError(f"{len(tasks)} tasks but {len(solutions)} solutions")
        key = f"ray:{client}"
        admitted = [self._admissible(task) for task in tasks]
        ok = [i for i, task in enumerate(admitted) if isinstance(task, Task)]
        futures: list[Future] = [Future() for _ in tasks]
        queued = await self.clients.submit(
            key, [admitted[i] for i in ok], [solutions[i] for i in ok], timeout_s, leased=True
        )
        for i, future in zip(ok, queued, strict=True):
            futures[i] = future
        for i, task in enumerate(admitted):
            if not isinstance(task, Task):
                settle(futures[i], error=task)
        batch = next(self._ids)
        self._batches[batch] = (key, dict(enumerate(futures)))
        self._clients_batches += 1
        return batch

    async def result(self, token: str, batch: int, index: int) -> EvalResult:
        """One item of a batch; each item is handed out once, then forgotten."""
        self._check(token)
        try:
            owner, futures = self._batches[batch]
            self.clients.touch(owner)  # asking for a result is a sign of life too
            future = futures.pop(index)
        except KeyError:
            raise KeyError(f"no pending item {index} of batch {batch}") from None
        if not self._batches[batch][1]:
            del self._batches[batch]
        return await asyncio.wrap_future(future)

    async def heartbeat(self, token: str, client: str) -> bool:
        """A ServiceClient's lease renewed; False when the service dropped it meanwhile."""
        self._check(token)
        return self.clients.touch(f"ray:{client}")

    async def release(self, token: str, client: str) -> int:
        """A ServiceClient closes: cancel what it still has; how many items that was."""
        self._check(token)
        return self._drop(f"ray:{client}", "the client closed")

    def _drop(self, key: str, why: str) -> int:
        left = self.clients.drop(key, why)
        for batch in [b for b, (owner, _) in self._batches.items() if owner == key]:
            del self._batches[batch]
        if left:
            log.info("client %s dropped (%s): %d items cancelled", key, why, left)
        return left

    async def _sweep(self) -> None:
        """Drop the Ray clients whose lease ran out: their process died without a goodbye."""
        lease = self.limits.client_lease_s
        interval = min(lease / 4, 5.0)
        last = time.monotonic()
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for key in self.clients.tick(now - last, interval):
                self._drop(key, f"no word from the client for {lease:g} s")
            last = now

    def _pool_submit(
        self, tasks: list[Task], solutions: list[str], timeout_s: float | None
    ) -> list[Future[EvalResult]]:
        """Into the pool: trusted tasks through the results store, untrusted ones around it
        (their results are not the service's to keep or to serve to another client)."""
        trusted = [i for i, task in enumerate(tasks) if task.trusted]
        untrusted = [i for i, task in enumerate(tasks) if not task.trusted]
        futures: list[Future[EvalResult]] = [Future() for _ in tasks]
        for pool, indexes in ((self.front, trusted), (self.pool, untrusted)):
            if indexes:
                batch = pool.submit([tasks[i] for i in indexes],
                                    [solutions[i] for i in indexes], timeout_s)  # fmt: skip
                for i, future in zip(indexes, batch, strict=True):
                    futures[i] = future
        return futures

    def _admissible(self, task: Any) -> Task | TaskError:
        """The task to evaluate for one a client sent: the service's own (trusted) when it
        holds one of the same source and metadata, else an untrusted copy when inline tasks
        are allowed, else the TaskError refusing it. Nothing of the client's object is kept
        but plain fields: its ``trusted`` flag, a subclass' behaviour, are not believed."""
        if not isinstance(task, Task) or not isinstance(task.source, str):
            return TaskError(f"not a Task: {type(task).__name__}")
        try:
            held = self._held.get(_identity(task))
            if held is not None:
                return _as_named(held, str(task.id), str(task.backend))
            if not self.allow_inline_tasks:
                return TaskError(self._refusal(f"task {task.id!r}"))
            fields = {f.name: getattr(task, f.name) for f in dataclasses.fields(Task)}
            return Task(**{**fields, "id": str(task.id), "trusted": False})
        except (TypeError, ValueError) as exc:  # TaskError included: an unknown backend, ...
            return exc if isinstance(exc, TaskError) else TaskError(f"task {task.id!r}: {exc}")

    def _refusal(self, what: str) -> str:
        return (
            f"{what} is not one of the {len(self.tasks)} tasks this service holds, and it"
            " evaluates no others (start it with allow_inline_tasks: true to evaluate client"
            " tasks, untrusted, in the sandbox)"
        )

    async def stats(self, token: str) -> dict[str, Any]:
        self._check(token)
        stats = self.pool.stats()
        stats["service_uptime_s"] = time.time() - self.started
        stats["batches_served"] = self._clients_batches
        stats["items_not_collected"] = sum(len(b) for _, b in self._batches.values())
        stats.update(self.clients.stats())
        stats["service_pid"] = os.getpid()
        stats["service_rss_bytes"] = _rss_bytes()
        stats["http_in_flight"] = self._http_in_flight
        stats["http_answered"] = {str(k): v for k, v in sorted(self._http_answered.items())}
        if self.store is not None and self.cache is not None:
            stats["store_path"] = self.store_path
            stats["store_results"] = self.store.count()
            stats["cache_hits"] = self.cache.hits
            stats["cache_misses"] = self.cache.misses
        return stats

    def shutdown(self, token: str, timeout_s: float | None = 30.0) -> None:
        """Finish or fail what is running, then stop the workers."""
        if not token_matches(token, self._digest):
            raise PermissionError("the environment service refused the token")
        self.pool.close(timeout_s)
        if self.store is not None:
            self.store.close()
        self._executor.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ HTTP requests
    async def evaluate_request(self, token: str, body: Any) -> tuple[int, Any]:
        """(HTTP status, JSON payload) for one request body of the HTTP endpoint.

        ``{"task_id": "01_relu" | "task": {"source": ..., "id": ..., "backend": ...},
        "solution": "...", "timeout_s": 60}`` -> one EvalResult; ``{"items": [...]}`` -> a list.
        Each request is one client: when it is cancelled (the HTTP client disconnected), all
        of its items are, wherever they are.
        """
        self._check(token)
        self._http_in_flight += 1
        code = 499  # nginx's "client closed request": cancelled before an answer
        try:
            code, payload = await self._evaluate_request(body)
            return code, payload
        finally:
            self._http_in_flight -= 1
            self._http_answered[code] = self._http_answered.get(code, 0) + 1

    async def _evaluate_request(self, body: Any) -> tuple[int, Any]:
        try:
            many = isinstance(body, dict) and "items" in body
            items = body["items"] if many else [body]
            if not isinstance(items, list) or not items:
                raise TaskError("'items' must be a non-empty list")
            limit = self.limits.max_items_per_request
            if len(items) > limit:
                return 413, {"error": f"{len(items)} items in one request; the limit is {limit}"}
            pairs = [self._parse_item(item) for item in items]
            timeout_s = body.get("timeout_s") if isinstance(body, dict) else None
            if timeout_s is not None and not isinstance(timeout_s, int | float):
                raise TaskError("'timeout_s' must be a number")
        except _Refused as exc:
            return 403, {"error": str(exc)}
        except _BrokenTask as exc:  # a well-formed request whose task cannot be used
            return 422, {"error": str(exc)}
        except (TaskError, KeyError, TypeError) as exc:
            return 400, {"error": str(exc)}
        try:
            results = await self._evaluate([t for t, _ in pairs], [s for _, s in pairs], timeout_s)
        except TaskError as exc:
            return 422, {"error": str(exc)}
        except Exception as exc:
            if isinstance(exc, RuntimeError) and "pool is closed" in str(exc):
                return 503, {"error": "the service is stopping; retry", "retryable": True}
            log.exception("HTTP evaluation failed")
            return 500, {"error": f"{type(exc).__name__}: {exc}"}
        payload = [r.to_dict() for r in results]
        return 200, payload if many else payload[0]

    async def _evaluate(
        self, tasks: list[Task], solutions: list[str], timeout_s: float | None
    ) -> list[EvalResult]:
        """One HTTP request's items, as one client: whatever ends the request (an answer, an
        error, the client leaving) leaves nothing of it in the service or the pool."""
        key = f"http:{next(self._http_ids)}"
        try:
            futures = await self.clients.submit(key, tasks, solutions, timeout_s, leased=False)
            # asyncio.wait, not gather: a cancelled wait leaves the answers to _drop, which
            # takes each item out of the service and the pool, and counts it.
            waiting = [asyncio.wrap_future(f) for f in futures]
            for future in waiting:  # answers nobody reads (dropped) are not logged as lost
                future.add_done_callback(lambda f: f.cancelled() or f.exception())
            await asyncio.wait(waiting, return_when=asyncio.FIRST_EXCEPTION)
            failed = [f for f in waiting if f.done() and f.exception() is not None]
            if failed:
                raise failed[0].exception()
            return [f.result() for f in waiting]
        except ClientGone as exc:
            raise RuntimeError(f"pool is closed ({exc})") from exc
        finally:  # answered: nothing is left; cancelled (the client left) or failed: the rest goes
            self._drop(key, "the HTTP request ended before its answer")

    def _parse_item(self, item: Any) -> tuple[Task, str]:
        if not isinstance(item, dict):
            raise TaskError("each item must be a JSON object")
        solution = item.get("solution")
        if not isinstance(solution, str) or not solution.strip():
            raise TaskError("'solution' must be a non-empty string (code or a model completion)")
        if "task_id" in item:
            task = self.tasks.get(str(item["task_id"]))
            if task is None:
                raise TaskError(
                    f"unknown task_id {item['task_id']!r} (this service knows {len(self.tasks)} tasks)"
                )
        elif isinstance(item.get("task"), dict) and isinstance(item["task"].get("source"), str):
            task = self._inline_task(item["task"])
        else:
            raise TaskError("give 'task_id' or 'task': {'source': ..., 'id': ..., 'backend': ...}")
        backend = item.get("backend")
        if backend is not None and backend != task.backend:
            task = task.with_backend(str(backend))
        return task, solution

    def _inline_task(self, spec: dict[str, Any]) -> Task:
        """An inline task: read (never run: parsed, its metadata a literal) as untrusted; the
        service's own task when it holds that source and metadata; refused unless allowed."""
        task_id = str(spec.get("id", "http_task"))
        held = _identity_of_source(spec["source"]) in self._sources
        if not (self.allow_inline_tasks or held):  # refused before it is even parsed
            raise _Refused(self._refusal("the inline task"))
        try:
            task = task_from_source(
                spec["source"], task_id, str(spec.get("backend", "triton")), trusted=False
            )
        except TaskError as exc:  # syntax error, no Model, ...: 422, as for a broken task
            raise _BrokenTask(str(exc)) from exc
        admitted = self._admissible(task)
        if isinstance(admitted, TaskError):
            raise _Refused(str(admitted))
        return admitted


def _identity(task: Task) -> tuple[str, str]:
    """What makes two tasks the same evaluation: the source and the metadata that changes the
    verdict (sizes, tolerances); not the id, the backend (chosen per request) or the flag."""
    try:
        meta = json.dumps([task.atol, task.rtol, task.sizes], sort_keys=True, default=str)
    except (TypeError, ValueError):
        meta = repr((task.atol, task.rtol, task.sizes))
    return _identity_of_source(task.source), meta


def _identity_of_source(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def _as_named(held: Task, task_id: str, backend: str) -> Task:
    """The service's own task under the client's id and backend (labels, not trust)."""
    task = held if backend == held.backend else held.with_backend(backend)
    return task if task_id == task.id else dataclasses.replace(task, id=task_id)


def _rss_bytes() -> int:
    """Resident memory of this process (the service's own, not its workers')."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class _BrokenTask(TaskError):
    """An inline task that does not load (HTTP 422, not 400: the request itself is fine)."""


class _Refused(TaskError):
    """An inline task this service does not evaluate (HTTP 403)."""


# ---------------------------------------------------------------------------------- lifecycle
def start_service(
    config: EvalConfig,
    pool_kwargs: dict[str, Any],
    store_path: str | None = None,
    tasks: Mapping[str, Task] | None = None,
    name: str = SERVICE_NAME,
    namespace: str = NAMESPACE,
    ready_timeout_s: float = 600.0,
    max_restarts: int = 3,
    *,
    token: str,
    limits: ClientLimits | None = None,
    allow_inline_tasks: bool = False,
) -> Any:
    """Create the named, detached service actor on the connected cluster and wait until its
    workers are ready. Returns the actor handle; fails if one with that name already runs.
    ``token``: the bearer token every client must present (``write_token`` makes one); the
    actor keeps only its digest, so a restart by Ray serves the same token."""
    import ray

    try:
        ray.get_actor(name, namespace=namespace)
    except ValueError:
        pass
    else:
        raise ValueError(
            f"an environment service named {name!r} already runs in namespace {namespace!r}"
            " (stop it with `kernelrl env stop`, or pick another name)"
        )
    actor = (
        ray.remote(EnvService)
        .options(
            name=name,
            namespace=namespace,
            lifetime="detached",  # outlives the `kernelrl env serve` process that made it
            num_cpus=0,  # a dispatcher, not a worker: it must not take a worker's CPU
            max_restarts=max_restarts,
            max_concurrency=10_000,
        )
        .remote(
            config,
            pool_kwargs,
            store_path,
            dict(tasks or {}),
            digest=token_digest(token),
            limits=limits or ClientLimits(),
            allow_inline_tasks=allow_inline_tasks,
        )  # fmt: skip
    )
    try:
        ray.get(actor.info.remote(token), timeout=ready_timeout_s)
    except BaseException:
        ray.kill(actor, no_restart=True)
        raise
    return actor


def stop_service(
    token: str, name: str = SERVICE_NAME, namespace: str = NAMESPACE, timeout_s: float = 60
) -> bool:
    """Stop the service (and its HTTP app when there is one); False if none was running.
    A service that refuses ``token`` is left running (ValueError): stopping it is for the
    holders of its token (as Ray's own ``ray.kill`` is for the holders of Ray's)."""
    import ray

    try:
        actor = ray.get_actor(name, namespace=namespace)
    except ValueError:
        stop_http()
        return False
    try:
        ray.get(actor.info.remote(token), timeout=timeout_s / 2)
    except PermissionError:
        raise ValueError(f"environment service {name!r} refused the token; not stopped") from None
    except Exception as exc:  # dead or stuck: stopped below anyway
        log.warning("service info before stopping: %s", exc)
    stop_http()
    try:
        ray.get(actor.shutdown.remote(token, timeout_s=timeout_s / 2), timeout=timeout_s)
    except Exception as exc:  # dead or stuck: killed below anyway
        log.warning("service shutdown: %s", exc)
    ray.kill(actor, no_restart=True)
    return True
