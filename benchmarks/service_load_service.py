"""The service side of the load test: `kernelrl env serve` as a restartable subprocess, and
one hand-written HTTP exchange with it (so that a client can misbehave exactly)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelrl.env.pools.service import read_token

sys.path.insert(0, str(Path(__file__).resolve().parent))
from service_load_config import ROOT, LoadConfig  # noqa: E402

RETRYABLE_ERRORS = (ConnectionError, asyncio.IncompleteReadError, TimeoutError, OSError)


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


def _serve_starting(reply: Reply) -> bool:
    """Ray Serve's proxy answers 404 (plain text) until the app's route is registered: the
    first seconds of every (re)start. Not our JSON 404 for a wrong path."""
    return isinstance(reply.payload, str) and "not found" in reply.payload
