"""The clients of a load run: well-formed ones that retry what is retryable, one per kind of
bad request, ones that hang up after sending, the faults (a worker killed, the service
restarted) and the sampler of the service's counters and memory."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from service_load_config import (  # noqa: E402
    BAD_KINDS,
    BROKEN_REFERENCE,
    HANGING,
    SOLUTIONS,
    TASKS,
    LoadConfig,
)
from service_load_service import Reply, Service, _serve_starting, http  # noqa: E402


@dataclass
class Request:
    """One well-formed request as its client sees it, over all its attempts."""

    rid: int
    task_id: str
    fresh: bool
    solution_hash: str
    phase: str
    started: float
    attempts: list[str] = field(default_factory=list)  # why each unanswered attempt failed
    answered: int = 0  # 200 answers for its task and solution
    wrong: int = 0  # 200 answers for another task or solution
    fatal: str = ""  # a non-retryable error for a well-formed request
    seconds: float | None = None
    status: str = ""


class Load:
    """The clients of one run, the faults, the samples, and the records they leave."""

    def __init__(self, config: LoadConfig, service: Service) -> None:
        self.config = config
        self.service = service
        self.port = service.port
        self.tasks = TASKS[: max(1, config.tasks)]
        self.solutions = {t: (SOLUTIONS / f"{t}.py").read_text() for t in TASKS}
        self.repeats = [
            (t, self.solutions[t] + f"\n# repeat {k}\n") for t in self.tasks for k in (0, 1)
        ]
        self.requests: list[Request] = []
        self.bad: list[dict[str, Any]] = []
        self.disconnects: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.phase = "clean"
        self.abuse = False
        self.stopping = False
        self.t0 = time.monotonic()
        self.ids = iter(range(10**9))
        self.random = random.Random(0)
        self.final: dict[str, Any] | None = None
        self.stopped = float("inf")
        self.phase_spans: dict[str, tuple[float, float]] = {}
        self.route_missing_after_ready = 0  # Ray Serve's 404 after the ready banner

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 2)

    async def http(self, method: str, path: str, body: bytes = b"", **options: Any) -> Reply:
        """One exchange with the service, presenting its current token (a restarted service
        has a new one)."""
        return await http(self.port, method, path, body, token=self.service.token, **options)

    async def good_client(self, index: int) -> None:
        while not self.stopping:
            fresh = self.random.random() < self.config.fresh_fraction
            if fresh:
                task_id = self.tasks[self.random.randrange(len(self.tasks))]
                solution = (
                    self.solutions[task_id] + f"\n# client {index} request {next(self.ids)}\n"
                )
            else:
                task_id, solution = self.repeats[self.random.randrange(len(self.repeats))]
            await self.well_formed(task_id, solution, fresh)

    async def well_formed(self, task_id: str, solution: str, fresh: bool) -> Request:
        """Send until answered; retry what is retryable, as a client of the service should."""
        digest = hashlib.sha256(solution.encode()).hexdigest()[:16]
        request = Request(next(self.ids), task_id, fresh, digest, self.phase, time.monotonic())
        self.requests.append(request)
        body = json.dumps({"task_id": task_id, "solution": solution}).encode()
        delay = 0.5
        while True:
            sent_while_ready = self.service.ready
            reply = await self.http(
                "POST", "/evaluate", body, timeout_s=self.config.request_timeout_s
            )
            if sent_while_ready and reply.code == 404 and _serve_starting(reply):
                self.route_missing_after_ready += 1
            why = self._retryable(reply)
            if why is None:
                break
            request.attempts.append(why)
            if self.stopping and time.monotonic() - self.stopped > self.config.drain_s:
                return request  # left with a retryable error: counted, not lost
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
        request.seconds = time.monotonic() - request.started
        if reply.code != 200:
            request.fatal = f"{reply.code}: {str(reply.payload)[:200]}"
        elif (reply.payload.get("task_id"), reply.payload.get("solution_hash")) != (
            task_id,
            digest,
        ):
            request.wrong += 1
        else:
            request.answered += 1
            request.status = reply.payload.get("status", "")
        return request

    @staticmethod
    def _retryable(reply: Reply) -> str | None:
        """Why this answer is a clear retryable error, or None when it is the answer. 408: the
        body did not reach the service in time (HTTP: the client may repeat the request)."""
        if reply.code is None:
            return reply.error or "no answer"
        if reply.code in (503, 408):
            return str(reply.code)
        if reply.code == 404 and _serve_starting(reply):
            return "404 (Ray Serve route table not populated yet)"
        sandbox = reply.payload.get("sandbox") if isinstance(reply.payload, dict) else None
        if reply.code == 200 and isinstance(sandbox, dict) and "pool_error" in sandbox:
            return f"pool_error:{sandbox['pool_error']}"
        return None

    async def bad_client(self, kind: str) -> None:
        while not self.stopping:
            if not self.abuse:
                await asyncio.sleep(0.5)
                continue
            reply = await self.bad_request(kind)
            self.bad.append(
                {"kind": kind, "code": reply.code, "seconds": round(reply.seconds, 3),
                 "error": reply.error, "phase": self.phase, "at": self.now(),
                 "status": reply.payload.get("status") if isinstance(reply.payload, dict) else None}
            )  # fmt: skip
            await asyncio.sleep(self.config.bad_interval_s)

    async def bad_request(self, kind: str) -> Reply:
        relu = self.solutions["01_relu"]
        if kind == "malformed_json":
            return await self.http("POST", "/evaluate", b'{"task_id": "01_relu", "sol')
        if kind == "wrong_schema":
            body = json.dumps({"task": "01_relu", "code": relu, "timeout_s": "soon"})
            return await self.http("POST", "/evaluate", body.encode())
        if kind == "oversized":  # a body the client really sends, twice the limit
            size = int(self.config.max_body_mb * (1 << 20)) * 2
            body = json.dumps({"task_id": "01_relu", "solution": relu + "#" * size})
            return await self.http("POST", "/evaluate", body.encode())
        if kind == "slow_body":  # one byte every half second: would take minutes
            body = json.dumps({"task_id": "01_relu", "solution": relu}).encode()
            return await self.http("POST", "/evaluate", body, trickle_s=0.5)
        if kind == "task_not_loading":
            body = json.dumps({"task": {"source": "x = 1", "id": "nope"}, "solution": relu})
            return await self.http("POST", "/evaluate", body.encode())
        if kind == "reference_failing":
            task = {"source": BROKEN_REFERENCE, "id": f"broken_{next(self.ids)}"}
            body = json.dumps({"task": task, "solution": relu + f"\n# {next(self.ids)}\n"})
            return await self.http("POST", "/evaluate", body.encode())
        if kind == "hanging_solution":
            solution = HANGING + f"\n# hang {next(self.ids)}\n"
            body = json.dumps({"task_id": "01_relu", "solution": solution})
            return await self.http("POST", "/evaluate", body.encode())
        raise ValueError(kind)

    async def disconnect_client(self, index: int) -> None:
        while not self.stopping:
            if not self.abuse:
                await asyncio.sleep(0.5)
                continue
            task_id = self.tasks[self.random.randrange(len(self.tasks))]
            solution = self.solutions[task_id] + f"\n# gone {index} {next(self.ids)}\n"
            body = json.dumps({"task_id": task_id, "solution": solution}).encode()
            # Long enough for the request to reach the service on a loaded box (the proxy,
            # then the actor): a hang-up before that cancels nothing because nothing started.
            after = self.random.uniform(0.5, 4.0)
            reply = await self.http("POST", "/evaluate", body, disconnect_after_s=after)
            if reply.error != "disconnected":  # refused while the service restarts: not one
                await asyncio.sleep(0.5)
                continue
            digest = hashlib.sha256(solution.encode()).hexdigest()
            self.disconnects.append({"at": self.now(), "solution_hash": digest})
            await asyncio.sleep(0.2)

    async def sampler(self, every_s: float = 5.0) -> None:
        while not self.stopping:
            await self.sample()
            await asyncio.sleep(every_s)

    async def sample(self) -> dict[str, Any] | None:
        reply = await self.http("GET", "/status", timeout_s=30)
        if reply.code != 200 or not isinstance(reply.payload, dict):
            return None
        stats = reply.payload
        row = {
            "at": self.now(),
            "phase": self.phase,
            "load_avg_1m": os.getloadavg()[0],
            "service_pid": stats.get("service_pid"),
            "rss_mb": _service_rss_mb(stats, self.service.process.pid if self.service.process else 0),
            **{k: stats.get(k) for k in ("queued", "in_flight", "completed", "cancelled",
                                         "http_in_flight", "service_queued", "worker_deaths",
                                         "retried", "store_results", "cache_hits",
                                         "cache_misses", "http_answered")},
        }  # fmt: skip
        row["worker_pids"] = [w["pid"] for w in stats["workers"] if w["kind"] == "gpu"]
        self.samples.append(row)
        return row

    async def faults(self) -> None:
        """A worker killed, then the service process restarted, during the faults phase."""
        c = self.config
        if c.kill_worker:
            await asyncio.sleep(c.phase_s * 0.2)
            row = await self.sample()
            if row and row["worker_pids"]:
                pid = row["worker_pids"][0]
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                self.events.append({"at": self.now(), "event": f"SIGKILL worker pid {pid}"})
        if c.restart_service:
            await asyncio.sleep(c.phase_s * 0.2)
            sig = getattr(signal, f"SIG{c.restart_signal}")
            self.events.append(
                {"at": self.now(), "event": f"service restart (SIG{c.restart_signal})"}
            )
            seconds = await asyncio.to_thread(self.service.restart, sig)
            self.events.append(
                {"at": self.now(), "event": f"service back after {seconds:.1f} s start"}
            )

    async def run(self) -> None:
        c = self.config
        kinds = [k for k in c.bad_kinds.split(",") if k]
        unknown = set(kinds) - set(BAD_KINDS)
        if unknown:
            raise ValueError(f"unknown bad kinds {sorted(unknown)}; known: {list(BAD_KINDS)}")
        # Warm-up: the repeated solutions are evaluated once, so that in the phases a repeat
        # is a cache hit (the service's own overhead) and a fresh one a real evaluation.
        self.phase = "warmup"
        await asyncio.gather(*(self.well_formed(t, s, True) for t, s in self.repeats))
        self.t0 = time.monotonic()
        tasks = [asyncio.ensure_future(self.good_client(i)) for i in range(c.clients)]
        tasks += [asyncio.ensure_future(self.bad_client(kind)) for kind in kinds]
        tasks += [
            asyncio.ensure_future(self.disconnect_client(i)) for i in range(c.disconnect_clients)
        ]
        tasks.append(asyncio.ensure_future(self.sampler()))
        phases = [("clean", c.phase_s, False), ("abuse", c.phase_s, True)]
        if c.kill_worker or c.restart_service:
            phases.append(("faults", c.phase_s, True))
        if c.long_s > 0:
            phases.append(("long", c.long_s, True))
        for name, seconds, abuse in phases:
            self.phase, self.abuse = name, abuse
            started = self.now()
            self.events.append({"at": started, "event": f"phase {name}"})
            fault = asyncio.ensure_future(self.faults()) if name == "faults" else None
            await asyncio.sleep(seconds)
            if fault is not None:
                await fault  # a restart that outlasts the phase extends it
            self.phase_spans[name] = (started, self.now())
        self.stopping = True
        self.stopped = time.monotonic()
        self.events.append({"at": self.now(), "event": "clients stop; draining"})
        await asyncio.wait(tasks, timeout=c.drain_s + c.request_timeout_s)
        # Once every client has its answer or gave up, nothing may be left in the service.
        deadline = time.monotonic() + c.timeout_s + 60
        last = None
        while time.monotonic() < deadline:
            last = await self.sample()
            if last and not (last["queued"] or last["in_flight"] or last["http_in_flight"]):
                break
            await asyncio.sleep(2)
        self.final = last


def _service_rss_mb(stats: dict[str, Any], serve_pid: int) -> dict[str, float]:
    """Resident memory (MB) of the service's processes: the service actor (its own figure), the
    HTTP proxy and replica (by their Ray process titles, among the descendants of this run's
    `kernelrl env serve`: other Ray clusters on the box are not counted) and the workers."""
    import psutil

    rss = {"service": stats.get("service_rss_bytes", 0) / 2**20}
    roles = {"http_proxy": "ProxyActor", "http_replica": "ServeReplica"}
    try:
        ours = psutil.Process(serve_pid).children(recursive=True)
    except psutil.Error:
        ours = []
    for proc in ours:
        with contextlib.suppress(psutil.Error):
            line = " ".join(proc.cmdline())
            for role, marker in roles.items():
                if marker in line:
                    rss[role] = rss.get(role, 0.0) + proc.memory_info().rss / 2**20
    for w in stats.get("workers", []):
        with contextlib.suppress(psutil.Error, ValueError, TypeError):
            rss[f"{w['kind']}_worker_{w['index']}"] = (
                psutil.Process(int(w["pid"])).memory_info().rss / 2**20
            )
    return {k: round(v, 1) for k, v in rss.items()}
