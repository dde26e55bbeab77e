"""Load test of the environment service: `kernelrl env serve` over HTTP on loopback.

Why: training, sweeps and curation of several users share one service, and none of its fault
tests said what load it holds or that nothing is lost under it. This script starts the real
service (its own local Ray, CPU workers under the Triton interpreter), drives it with many
concurrent HTTP clients and, on top of the well-formed traffic, with the clients a shared
service meets: bad requests (malformed JSON, a wrong schema, an oversized body, a body that
trickles in, a task that does not load, a solution that hangs), clients that disconnect before
their answer, a worker killed mid-run and the service process itself restarted mid-run.

It reports throughput and latency percentiles (p50/p95/p99) per evaluation and phase, the
memory of the service's processes over the run, and checks the requirements (``check``):

- every well-formed request is answered exactly once with a result for *its* task and
  solution, or gets a clear retryable error (503, connection refused/reset while the service
  restarts, a result marked ``sandbox["pool_error"]``), which the client retries;
- no (task, solution, device, versions) is recorded twice as a verdict in the results store;
- bad requests get their 4xx (or, for a hanging solution, the ``timeout`` verdict) within a
  bound;
- a disconnected client's queued work is cancelled, and once the clients stop nothing is left
  in flight in the service.

    python benchmarks/service_load.py --clients 64 --phase-s 60 --long-s 600 --out runs/load
    python benchmarks/service_load.py --help

``tests/benchmarks/test_service_load.py`` runs the same code at a small scale.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import re
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kernelrl.env.pools.service import read_token

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "data" / "solutions" / "triton"
# Cheap bundled tasks (well under a second per evaluation on CPU): throughput is the service's.
TASKS = ("01_relu", "02_gelu_tanh", "04_gated_residual", "05_channel_affine", "06_row_sum")
HANGING = (
    (SOLUTIONS / "01_relu.py")
    .read_text()
    .replace(
        "        return relu(x)",
        "        while x.numel() > 0:\n            pass\n        return relu(x)",
    )
)
BROKEN_REFERENCE = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(y)


def get_inputs():
    return [torch.randn(64)]


def get_init_inputs():
    return []
"""
# Bad requests: kind -> the status it must get (a hanging solution is a well-formed request:
# its answer is the evaluator's `timeout` verdict).
BAD_KINDS = {
    "malformed_json": 400,
    "wrong_schema": 400,
    "oversized": 413,
    "slow_body": 408,
    "task_not_loading": 422,
    "reference_failing": 422,
    "hanging_solution": 200,
}
RETRYABLE_ERRORS = (ConnectionError, asyncio.IncompleteReadError, TimeoutError, OSError)


@dataclass
class LoadConfig:
    """One load run. Phases: clean (well-formed traffic only), abuse (plus bad clients and
    disconnecting clients), faults (plus a worker kill and a service restart), long (abuse
    continues; the memory figure comes from it)."""

    clients: int = 64
    phase_s: float = 60.0
    long_s: float = 300.0
    fresh_fraction: float = 0.1  # requests with a never-seen solution (a real evaluation)
    tasks: int = len(TASKS)  # the first N of TASKS; 2 repeated solutions each
    disconnect_clients: int = 4
    bad_interval_s: float = 1.0
    workers: int = 2
    per_gpu: int = 2
    timeout_s: float = 60.0  # the evaluator's limit: bounds the hanging solution
    body_timeout_s: float = 30.0
    max_body_mb: float = 1.0
    bad_kinds: str = ",".join(BAD_KINDS)  # which bad clients run (comma-separated)
    kill_worker: bool = True
    restart_service: bool = True
    restart_signal: str = "KILL"
    request_timeout_s: float = 600.0
    drain_s: float = 180.0
    out: str = "runs/service_load"
    port: int = 0
    name: str = "kernelrl-env-load"


# ---------------------------------------------------------------------------------- service
class Service:
    """`kernelrl env serve` in a subprocess (its own local Ray), restartable on the same store
    and port: what an operator does."""

    def __init__(self, config: LoadConfig, folder: Path) -> None:
        self.config = config
        self.folder = folder
        self.store_path = folder / "results.db"
        self.port = config.port or _free_port()
        self.process: subprocess.Popen | None = None
        self.starts: list[float] = []
        self.ready = False  # between the ready banner and the next stop
        self.token = ""  # the service's bearer token, read after each start
        self.env = {**os.environ, "RAY_AUTH_MODE": "token", "HF_HUB_OFFLINE": "1"}

    def start(self, ready_timeout_s: float = 600.0) -> float:
        """Start and wait for the HTTP banner; returns the seconds it took."""
        started = time.monotonic()
        c = self.config
        command = [
            sys.executable, "-m", "kernelrl.launch.cli", "env", "serve",
            "--config", str(ROOT / "recipes" / "env" / "local_cpu.yaml"),
            "--name", c.name, "--workers", str(c.workers), "--logical_gpus", str(c.workers),
            "--per_gpu", str(c.per_gpu), "--timeout_s", str(c.timeout_s),
            "--store_path", str(self.store_path), "--http_port", str(self.port),
            "--http_body_timeout_s", str(c.body_timeout_s),
            "--http_max_body_mb", str(c.max_body_mb),
            "--allow_inline_tasks", "true",  # bad clients send their own (broken) tasks
        ]  # fmt: skip
        log = open(self.folder / f"serve{len(self.starts)}.log", "w")  # noqa: SIM115 - child's
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=log, text=True, env=self.env, cwd=ROOT
        )
        log.close()
        assert self.process.stdout is not None
        while True:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError(f"serve exited ({self.process.wait()}); see {log.name}")
            if "HTTP:" in line:
                break
            if time.monotonic() - started > ready_timeout_s:
                raise RuntimeError("serve did not come up in time")
        self.token = read_token(c.name)  # each start writes a new one
        self.starts.append(time.monotonic() - started)
        self.ready = True
        return self.starts[-1]

    def stop(self, sig: int = signal.SIGINT, timeout_s: float = 120.0) -> None:
        """SIGINT/SIGTERM: the graceful stop; SIGKILL: a crash (the reaper ends its Ray)."""
        self.ready = False
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(sig)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if sig == signal.SIGKILL:  # the reaper ends what serve started; wait for the port
            deadline = time.monotonic() + 60
            while _port_open(self.port) and time.monotonic() < deadline:
                time.sleep(0.5)
            time.sleep(3)  # the raylet and its workers go after the proxy

    def restart(self, sig: int) -> float:
        self.stop(sig)
        return self.start_retrying()

    def start_retrying(self, attempts: int = 3) -> float:
        """``start``, tried again when it fails (Ray's node timing out on an overloaded box),
        as an operator would."""
        for attempt in range(attempts):
            try:
                return self.start()
            except RuntimeError:
                if attempt == attempts - 1:
                    raise
                self.stop(signal.SIGKILL)
                time.sleep(10)
        raise AssertionError("unreachable")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


# ---------------------------------------------------------------------------------- HTTP
@dataclass
class Reply:
    code: int | None  # None: no HTTP answer (refused, reset, closed)
    payload: Any = None
    seconds: float = 0.0
    error: str = ""


async def http(
    port: int,
    method: str,
    path: str,
    body: bytes = b"",
    *,
    token: str,
    content_length: int | None = None,
    trickle_s: float | None = None,
    disconnect_after_s: float | None = None,
    timeout_s: float = 600.0,
) -> Reply:
    """One HTTP/1.1 exchange on a fresh connection, written by hand so a client can misbehave
    exactly (declare a length, trickle its body byte by byte, hang up before the answer)."""
    started = time.monotonic()
    writer = None
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        length = len(body) if content_length is None else content_length
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {token}\r\n"
            f"Content-Length: {length}\r\nConnection: close\r\n\r\n"
        )
        writer.write(head.encode())
        if trickle_s is None:
            writer.write(body)
            with contextlib.suppress(ConnectionError):  # refused early (413): read the answer
                await writer.drain()
        else:
            trickling = asyncio.ensure_future(_trickle(writer, body, trickle_s))
        if disconnect_after_s is not None:
            await asyncio.sleep(disconnect_after_s)
            if reader.at_eof():  # answered (or refused) before we could hang up
                return Reply(None, seconds=time.monotonic() - started, error="closed first")
            return Reply(None, seconds=time.monotonic() - started, error="disconnected")
        answer = await asyncio.wait_for(reader.read(), timeout_s)
        if trickle_s is not None:
            trickling.cancel()
    except RETRYABLE_ERRORS as exc:
        return Reply(None, seconds=time.monotonic() - started, error=type(exc).__name__)
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
    seconds = time.monotonic() - started
    match = re.match(rb"HTTP/1\.[01] (\d{3})", answer)
    if match is None:
        return Reply(None, seconds=seconds, error="no HTTP answer")
    _, _, text = answer.partition(b"\r\n\r\n")
    try:
        payload = json.loads(text) if text else None
    except ValueError:
        payload = text[:200].decode(errors="replace")
    return Reply(int(match.group(1)), payload, seconds)


async def _trickle(writer: asyncio.StreamWriter, body: bytes, every_s: float) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        for index in range(len(body)):
            writer.write(body[index : index + 1])
            await writer.drain()
            await asyncio.sleep(every_s)


# ---------------------------------------------------------------------------------- clients
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


# ---------------------------------------------------------------------------------- report
def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "p99": None}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50": round(pick(0.50), 3), "p95": round(pick(0.95), 3), "p99": round(pick(0.99), 3)}


def store_duplicates(store_path: Path) -> int:
    """Verdicts recorded more than once for one (task, solution, device, versions)."""
    with contextlib.closing(sqlite3.connect(store_path)) as conn:
        rows = conn.execute(
            "SELECT COUNT(*) FROM (SELECT 1 FROM results WHERE cacheable = 1 GROUP BY"
            " task_hash, backend, solution_hash, device_name, versions HAVING COUNT(*) > 1)"
        ).fetchone()
    return int(rows[0])


def store_hashes(store_path: Path) -> set[str]:
    with contextlib.closing(sqlite3.connect(store_path)) as conn:
        return {row[0] for row in conn.execute("SELECT solution_hash FROM results")}


def report(load: Load) -> dict[str, Any]:
    """Figures per phase and the requirement checks (``failures`` lists what was violated)."""
    c = load.config
    phases: dict[str, Any] = {}
    for name, (start, end) in load.phase_spans.items():
        done = [r for r in load.requests if r.phase == name and r.answered]
        span = max(end - start, 1e-9)
        phases[name] = {
            "seconds": round(span, 1),
            "answered": len(done),
            "answers_per_s": round(len(done) / span, 2),
            "fresh_evaluations_per_s": round(sum(r.fresh for r in done) / span, 2),
            "latency_all_s": percentiles([r.seconds for r in done if r.seconds is not None]),
            "latency_fresh_s": percentiles([r.seconds for r in done if r.fresh]),
            "latency_repeat_s": percentiles([r.seconds for r in done if not r.fresh]),
            "retried_requests": sum(bool(r.attempts) for r in load.requests if r.phase == name),
        }
    bad: dict[str, Any] = {}
    for kind, expected in BAD_KINDS.items():
        rows = [b for b in load.bad if b["kind"] == kind and b["code"] is not None]
        bad[kind] = {
            "sent": sum(b["kind"] == kind for b in load.bad),
            "expected": expected,
            "codes": {str(k): sum(b["code"] == k for b in rows) for k in {b["code"] for b in rows}},
            "max_s": max((b["seconds"] for b in rows), default=None),
            "statuses": sorted({str(b["status"]) for b in rows if b["code"] == 200}),
        }
    seen = store_hashes(load.service.store_path)
    gone = load.disconnects
    rss = [s["rss_mb"] for s in load.samples if s["phase"] == "long" and s.get("rss_mb")]
    memory = {}
    if len(rss) >= 4:
        # The long phase's second half against its first: flat means no growth with requests.
        half = len(rss) // 2
        for role in rss[-1]:
            first = [r[role] for r in rss[:half] if role in r]
            second = [r[role] for r in rss[half:] if role in r]
            if first and second:
                memory[role] = {"first_half_mb": round(statistics.mean(first), 1),
                                "second_half_mb": round(statistics.mean(second), 1),
                                "max_mb": max(first + second)}  # fmt: skip
    loads = [s["load_avg_1m"] for s in load.samples]
    well_formed = load.requests
    summary = {
        "config": asdict(c),
        "service_starts_s": [round(s, 1) for s in load.service.starts],
        "events": load.events,
        "phases": phases,
        "well_formed": {
            "requests": len(well_formed),
            "answered_once": sum(r.answered == 1 for r in well_formed),
            "wrong_answers": sum(r.wrong for r in well_formed),
            "fatal": [r.fatal for r in well_formed if r.fatal][:10],
            "fatal_count": sum(bool(r.fatal) for r in well_formed),
            "left_retryable": sum(not r.answered and not r.fatal and not r.wrong for r in well_formed),
            "retry_reasons": _count(a.split(":")[0] for r in well_formed for a in r.attempts),
            "worker_deaths": _cumulative(load.samples, "worker_deaths"),
            "statuses": _count(r.status for r in well_formed if r.answered),
        },
        "bad": bad,
        "disconnects": {
            "sent": len(gone),
            "evaluated_anyway": sum(d["solution_hash"] in seen for d in gone),
            "cancelled_by_pool": _cumulative(load.samples, "cancelled"),
        },
        "after_drain": load.final,
        "store_duplicates": store_duplicates(load.service.store_path),
        "route_missing_after_ready": load.route_missing_after_ready,
        "memory_long_phase": memory,
        "load_avg_1m": {"min": min(loads, default=None), "max": max(loads, default=None),
                        "mean": round(statistics.mean(loads), 2) if loads else None},
        "samples": load.samples,
    }  # fmt: skip
    summary["failures"] = check(summary)
    return summary


def _cumulative(samples: list[dict[str, Any]], key: str) -> int:
    """A counter of the service summed over its incarnations (a restart starts it again)."""
    last: dict[Any, int] = {}
    for sample in samples:
        last[sample.get("service_pid")] = max(
            last.get(sample.get("service_pid"), 0), sample[key] or 0
        )
    return sum(last.values())


def _serve_starting(reply: Reply) -> bool:
    """Ray Serve's proxy answers 404 (plain text) until the app's route is registered: the
    first seconds of every (re)start. Not our JSON 404 for a wrong path."""
    return isinstance(reply.payload, str) and "not found" in reply.payload


def _count(values: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts


def check(summary: dict[str, Any]) -> list[str]:
    """The requirements, as counts and generous bounds (no tight timing: the box is shared)."""
    c = summary["config"]
    failures = []
    w = summary["well_formed"]
    if w["wrong_answers"]:
        failures.append(f"{w['wrong_answers']} answers were for another task or solution")
    if w["fatal"]:
        failures.append(f"well-formed requests got non-retryable errors: {w['fatal']}")
    if w["answered_once"] + w["left_retryable"] != w["requests"]:
        failures.append("a well-formed request was neither answered once nor left retryable")
    if w["left_retryable"] > max(2, w["requests"] // 100):
        failures.append(f"{w['left_retryable']} well-formed requests were never answered")
    if summary["store_duplicates"]:
        failures.append(f"{summary['store_duplicates']} verdicts are recorded twice in the store")
    # A failing reference and a hanging solution are evaluations: they wait in the same queue
    # as every fresh solution, so their bound is the slowest fresh answer plus their own limit.
    fresh = [p["latency_fresh_s"]["p99"] or 0.0 for p in summary["phases"].values()]
    queued = max(fresh, default=0.0) + c["timeout_s"] + 180
    bounds = {"slow_body": c["body_timeout_s"] + 60, "hanging_solution": queued,
              "reference_failing": queued}  # fmt: skip
    for kind, row in summary["bad"].items():
        if not row["sent"]:
            continue
        wrong = {k: n for k, n in row["codes"].items() if int(k) != row["expected"]}
        # retryable answers, not wrong ones: 503 while the service restarts, 408 when the body
        # did not reach a starved service in time, Ray Serve's 404 before its route is up
        for code in ("503", "408", "404"):
            wrong.pop(code, None)
        if wrong:
            failures.append(f"{kind}: expected {row['expected']}, got {wrong}")
        if row["max_s"] is not None and row["max_s"] > bounds.get(kind, 60):
            failures.append(f"{kind}: answered after {row['max_s']} s")
        if kind == "hanging_solution" and set(row["statuses"]) - {"timeout"}:
            failures.append(f"hanging solution answered {row['statuses']}, not timeout")
    final = summary["after_drain"] or {}
    for key in ("queued", "in_flight", "http_in_flight", "service_queued"):
        if final.get(key):
            failures.append(f"after the clients left the service still has {key}={final[key]}")
    if summary["route_missing_after_ready"]:
        failures.append(
            f"{summary['route_missing_after_ready']} requests sent after the ready banner got"
            " Ray Serve's 404: the service announced itself before its route was up"
        )
    d = summary["disconnects"]
    if d["sent"] >= 10 and d["evaluated_anyway"] >= d["sent"]:
        failures.append("no disconnected client's work was cancelled")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, default in asdict(LoadConfig()).items():
        flag = "--" + name.replace("_", "-")
        if isinstance(default, bool):
            parser.add_argument(
                flag, type=lambda s: s.lower() in ("1", "true", "yes"), default=default
            )
        else:
            parser.add_argument(flag, type=type(default), default=default)
    config = LoadConfig(**vars(parser.parse_args(argv)))
    summary = run_load(config)
    print(json.dumps({k: v for k, v in summary.items() if k != "samples"}, indent=1, default=str))
    return 1 if summary["failures"] else 0


def run_load(config: LoadConfig) -> dict[str, Any]:
    """Start the service, run the load, stop it; the summary is also written to ``out``."""
    folder = Path(config.out).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    service = Service(config, folder)
    service.start_retrying()
    try:
        load = Load(config, service)
        asyncio.run(load.run())
    finally:
        service.stop(signal.SIGINT)
    summary = report(load)
    (folder / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


if __name__ == "__main__":
    sys.exit(main())
