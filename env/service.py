"""The environment service: one long-lived evaluation pool that many jobs share.

Why a service: a trainer, an evaluation sweep and a curation job that each start their own pool
pay the worker start-up each time and fight over the same GPUs. ``kernelrl env serve`` instead
starts one ``EnvService``, a *named, detached* Ray actor that owns a ``RayPool`` (and, with a
results store, a ``CachedPool`` in front of it). Jobs on any node of the cluster find it by name
(``kernelrl.env.pools.service.ServiceClient``) and use it exactly like a local pool; agents outside
Ray speak HTTP to a Ray Serve deployment in front of the same actor (``start_http``).

The actor keeps the pool's futures and hands them out one item at a time (``submit`` returns a
batch id, ``result(batch, index)`` waits for one item), so a client gets one future per item and
the pool still sees whole batches (longest-first scheduling, batch deadlines).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from kernelrl.env.evaluator import EvalConfig
from kernelrl.env.pools.base import Pool
from kernelrl.env.pools.service import NAMESPACE, SERVICE_NAME
from kernelrl.env.result import EvalResult
from kernelrl.env.task import Task, TaskError, task_from_source

log = logging.getLogger(__name__)

HTTP_APP_NAME = "kernelrl-env-http"


class EnvService:
    """Ray actor body (async: thousands of clients may wait on results at once)."""

    def __init__(
        self,
        config: EvalConfig,
        pool_kwargs: dict[str, Any],
        store_path: str | None = None,
        tasks: Mapping[str, Task] | None = None,
    ) -> None:
        """``tasks``: the tasks HTTP clients may name by id instead of sending their source."""
        from kernelrl.env.pools.cached import CachedPool
        from kernelrl.env.pools.ray import RayPool
        from kernelrl.env.store import ResultsStore

        self.pool = RayPool(config, store_path=store_path, **pool_kwargs)
        self.store = ResultsStore(store_path) if store_path else None
        self.cache = CachedPool(self.pool, self.store) if self.store else None
        self.front: Pool = self.cache or self.pool
        self.tasks = dict(tasks or {})
        self.store_path = store_path
        self.started = time.time()
        self._batches: dict[int, dict[int, Future[EvalResult]]] = {}
        self._batch_started: dict[int, float] = {}
        self._ids = itertools.count()
        self._clients_batches = 0
        self._http_in_flight = 0  # HTTP evaluations being answered now (0 once clients left)
        self._http_answered: dict[int, int] = {}  # HTTP status -> requests answered so far

    # ------------------------------------------------------------------ pool protocol
    def info(self) -> dict[str, Any]:
        return {
            "device": self.pool.device,
            "device_name": self.pool.device_name,
            "versions": self.pool.versions,
            "num_slots": self.pool.num_slots,
            "workers": sum(1 for w in self.pool.stats()["workers"] if w["kind"] == "gpu"),
            "store_path": self.store_path,
            "tasks": len(self.tasks),
            "started": self.started,
        }

    async def submit(
        self, tasks: Sequence[Task], solutions: Sequence[str], timeout_s: float | None = None
    ) -> int:
        """Queue a batch (blocks while the pool is full: backpressure reaches the client)."""
        futures = await asyncio.to_thread(self._submit, tasks, solutions, timeout_s)
        self._forget_abandoned()
        batch = next(self._ids)
        self._batches[batch] = dict(enumerate(futures))
        self._batch_started[batch] = time.time()
        self._clients_batches += 1
        return batch

    def _submit(
        self, tasks: Sequence[Task], solutions: Sequence[str], timeout_s: float | None
    ) -> list[Future[EvalResult]]:
        return self.front.submit(tasks, solutions, timeout_s)

    async def result(self, batch: int, index: int) -> EvalResult:
        """One item of a batch; each item is handed out once, then forgotten."""
        try:
            future = self._batches[batch].pop(index)
        except KeyError:
            raise KeyError(f"no pending item {index} of batch {batch}") from None
        if not self._batches[batch]:
            del self._batches[batch], self._batch_started[batch]
        return await asyncio.wrap_future(future)

    def _forget_abandoned(self, after_s: float = 3600.0) -> None:
        """Results nobody collected an hour after they were ready (the client went away):
        dropped, so a long-lived service does not grow without bound. They are in the store."""
        cutoff = time.time() - after_s
        for batch, started in list(self._batch_started.items()):
            if started < cutoff and all(f.done() for f in self._batches[batch].values()):
                del self._batches[batch], self._batch_started[batch]

    async def evaluate(
        self, tasks: Sequence[Task], solutions: Sequence[str], timeout_s: float | None = None
    ) -> list[EvalResult]:
        """Cancellable: when the caller gives up (``ray.cancel``, as the HTTP endpoint does for
        a client that disconnected) its items are cancelled in the pool, so work nobody waits
        for does not take a worker."""
        submitting = asyncio.ensure_future(
            asyncio.to_thread(self._submit, tasks, solutions, timeout_s)
        )
        try:
            futures = await asyncio.shield(submitting)  # a submit under way is not lost
        except asyncio.CancelledError:
            submitting.add_done_callback(_cancel_submitted)
            raise
        try:
            return list(await asyncio.gather(*(asyncio.wrap_future(f) for f in futures)))
        except asyncio.CancelledError:
            for future in futures:
                future.cancel()  # only what no worker runs yet can be cancelled
            raise

    def stats(self) -> dict[str, Any]:
        stats = self.pool.stats()
        stats["service_uptime_s"] = time.time() - self.started
        stats["batches_served"] = self._clients_batches
        stats["items_not_collected"] = sum(len(b) for b in self._batches.values())
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

    def shutdown(self, timeout_s: float | None = 30.0) -> None:
        """Finish or fail what is running, then stop the workers."""
        self.pool.close(timeout_s)
        if self.store is not None:
            self.store.close()

    # ------------------------------------------------------------------ HTTP requests
    async def evaluate_request(self, body: Any) -> tuple[int, Any]:
        """(HTTP status, JSON payload) for one request body of the HTTP endpoint.

        ``{"task_id": "01_relu" | "task": {"source": ..., "id": ..., "backend": ...},
        "solution": "...", "timeout_s": 60}`` -> one EvalResult; ``{"items": [...]}`` -> a list.
        """
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
            pairs = [self._parse_item(item) for item in items]
            timeout_s = body.get("timeout_s") if isinstance(body, dict) else None
            if timeout_s is not None and not isinstance(timeout_s, int | float):
                raise TaskError("'timeout_s' must be a number")
        except _BrokenTask as exc:  # a well-formed request whose task cannot be used
            return 422, {"error": str(exc)}
        except (TaskError, KeyError, TypeError) as exc:
            return 400, {"error": str(exc)}
        try:
            results = await self.evaluate([t for t, _ in pairs], [s for _, s in pairs], timeout_s)
        except TaskError as exc:
            return 422, {"error": str(exc)}
        except Exception as exc:
            if isinstance(exc, RuntimeError) and "pool is closed" in str(exc):
                return 503, {"error": "the service is stopping; retry", "retryable": True}
            log.exception("HTTP evaluation failed")
            return 500, {"error": f"{type(exc).__name__}: {exc}"}
        payload = [r.to_dict() for r in results]
        return 200, payload if many else payload[0]

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
            spec = item["task"]
            try:
                task = task_from_source(
                    spec["source"],
                    str(spec.get("id", "http_task")),
                    str(spec.get("backend", "triton")),
                )
            except TaskError as exc:  # syntax error, no Model, ...: 422, as for a broken task
                raise _BrokenTask(str(exc)) from exc
        else:
            raise TaskError("give 'task_id' or 'task': {'source': ..., 'id': ..., 'backend': ...}")
        backend = item.get("backend")
        if backend is not None and backend != task.backend:
            task = task.with_backend(str(backend))
        return task, solution


def _cancel_submitted(submitting: asyncio.Future) -> None:
    """A submit that finished after its caller gave up: cancel what it queued."""
    if not submitting.cancelled() and submitting.exception() is None:
        for future in submitting.result():
            future.cancel()


def _rss_bytes() -> int:
    """Resident memory of this process (the service's own, not its workers')."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class _BrokenTask(TaskError):
    """An inline task that does not load (HTTP 422, not 400: the request itself is fine)."""


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
) -> Any:
    """Create the named, detached service actor on the connected cluster and wait until its
    workers are ready. Returns the actor handle; fails if one with that name already runs."""
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
        .remote(config, pool_kwargs, store_path, dict(tasks or {}))
    )
    try:
        ray.get(actor.info.remote(), timeout=ready_timeout_s)
    except BaseException:
        ray.kill(actor, no_restart=True)
        raise
    return actor


def stop_service(
    name: str = SERVICE_NAME, namespace: str = NAMESPACE, timeout_s: float = 60
) -> bool:
    """Stop the service (and its HTTP app when there is one); False if none was running."""
    import ray

    stop_http()
    try:
        actor = ray.get_actor(name, namespace=namespace)
    except ValueError:
        return False
    try:
        ray.get(actor.shutdown.remote(timeout_s=timeout_s / 2), timeout=timeout_s)
    except Exception as exc:  # dead or stuck: killed below anyway
        log.warning("service shutdown: %s", exc)
    ray.kill(actor, no_restart=True)
    return True


def start_http(
    name: str = SERVICE_NAME,
    namespace: str = NAMESPACE,
    host: str = "127.0.0.1",
    port: int = 8100,
    max_body_bytes: int = 8 << 20,
    body_timeout_s: float = 30.0,
) -> str:
    """Ray Serve in front of the service actor: ``POST /evaluate`` and ``GET /status``.

    The deployment only forwards JSON to the actor, so HTTP clients share the same pool, queue
    and results cache as Ray clients. It also keeps one client from hurting the others: a body
    over ``max_body_bytes`` is refused (413) before it is read, one that has not arrived
    ``body_timeout_s`` after the request started is refused (408: a client trickling its body
    holds nothing for long), and a client that disconnects has its evaluation cancelled. A
    service that is down or restarting is answered 503 with ``Retry-After``: retry the same
    request (the results store answers it if it was evaluated meanwhile). Returns the base URL.
    """
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    @serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1000)
    class EnvHTTP:
        def __init__(self, service_name: str, service_namespace: str) -> None:
            import ray

            self.service = ray.get_actor(service_name, namespace=service_namespace)

        async def __call__(self, request: Request) -> JSONResponse:
            path = request.url.path.rstrip("/")
            if request.method == "GET" and path.endswith("/status"):
                return await self._forward(self.service.stats.remote(), lambda s: (200, s))
            if request.method == "POST" and path.endswith("/evaluate"):
                body = await read_json_body(request, max_body_bytes, body_timeout_s)
                if isinstance(body, JSONResponse):
                    return body
                return await self._forward(self.service.evaluate_request.remote(body), tuple)
            return JSONResponse({"error": "use POST /evaluate or GET /status"}, 404)

        async def _forward(self, ref: Any, answer: Any) -> JSONResponse:
            import ray

            try:
                code, payload = answer(await ref)
            except asyncio.CancelledError:  # the client disconnected: its work is not wanted
                ray.cancel(ref)
                raise
            except ray.exceptions.RayActorError as exc:  # dead, restarting or unreachable
                why = f"the environment service is unavailable ({type(exc).__name__}); retry"
                return JSONResponse(
                    {"error": why, "retryable": True}, 503, headers={"Retry-After": "5"}
                )
            return JSONResponse(payload, code)

    serve.start(http_options={"host": host, "port": port})
    serve.run(EnvHTTP.bind(name, namespace), name=HTTP_APP_NAME, route_prefix="/")
    url = f"http://{host}:{port}"
    wait_for_route(url)
    return url


def wait_for_route(url: str, timeout_s: float = 120.0) -> None:
    """Return once ``GET /status`` is answered by our app, not by the proxy alone.

    Ray Serve's proxy listens before its route table holds the app that ``serve.run`` just
    deployed, and answers ``404 Path not found`` meanwhile; a service announced ready then would
    refuse its first clients. Raises TimeoutError naming the last answer."""
    import urllib.error
    import urllib.request

    host, port = url.removeprefix("http://").rsplit(":", 1)
    if host in ("0.0.0.0", "::", ""):  # listening everywhere: ask on loopback
        host = "127.0.0.1"
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://{host}:{port}/status", timeout=10) as answer:
                json.loads(answer.read())
                return
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
        except (OSError, ValueError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(0.2)
    raise TimeoutError(f"the HTTP endpoint {url} did not serve /status in {timeout_s:g} s ({last})")


async def read_json_body(request: Any, max_bytes: int, timeout_s: float) -> Any:
    """The JSON body of a starlette request, or the JSONResponse refusing it: 413 over
    ``max_bytes`` (by its Content-Length, before reading, or as it arrives), 408 when it is not
    all there within ``timeout_s``, 400 when it is not JSON. Bounded in time and memory whatever
    the client sends."""
    from starlette.responses import JSONResponse

    close = {"Connection": "close"}  # what is left of the body is not read
    too_large = JSONResponse(
        {"error": f"the request body is over the limit of {max_bytes} bytes"}, 413, headers=close
    )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        return too_large
    chunks: list[bytes] = []

    async def receive() -> bool:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                return False
            chunks.append(chunk)
        return True

    try:
        if not await asyncio.wait_for(receive(), timeout_s):
            return too_large
    except TimeoutError:
        why = f"the request body did not arrive within {timeout_s:g} s"
        return JSONResponse({"error": why, "retryable": True}, 408, headers=close)
    try:
        return json.loads(b"".join(chunks))
    except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError, too deep
        return JSONResponse({"error": "the request body must be JSON"}, 400)


def stop_http() -> None:
    try:
        from ray import serve

        serve.delete(HTTP_APP_NAME)
    except Exception:  # Serve not installed or not running: nothing to stop
        return
