"""The worker's side of the fork server (``sandbox.zygote``): asking it for a child, and a
handle on each forked child that reads like the ``subprocess.Popen`` of a child started on its
own (``pid``, ``poll``, ``wait``, ``kill``, ``returncode``), so that the rest of the sandbox
does not care how a child was made.

The worker is not the forked child's parent, so it holds a pidfd of it instead (signals and
the end of the process reach exactly that process, whatever pid reuse happens), and learns
its wait status from the server, its parent.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

READY_TIMEOUT_S = 180.0
STATUS_WAIT_S = 5.0


class ForkServerError(RuntimeError):
    """The fork server could not start, or could not fork a child."""


class ForkedProcess:
    """A child forked by the server, seen from the worker."""

    def __init__(self, pid: int, pidfd: int, server: ForkServer) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.lost_with_server = False  # ended without a status: its server died, then it
        self._pidfd = pidfd
        self._server = server
        self._lock = threading.Lock()  # the gate, a slot and the pool all poll the same child

    def poll(self) -> int | None:
        return self.wait(0) if self._ended(0) else None

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended(timeout):
            raise subprocess.TimeoutExpired(f"sandbox child {self.pid}", timeout or 0)
        with self._lock:
            if self.returncode is None:
                status = self._server.status_of(self.pid, STATUS_WAIT_S)
                # No status from the server (it died first): its death signal killed the child.
                self.lost_with_server = status is None
                self.returncode = (
                    -signal.SIGKILL if status is None else os.waitstatus_to_exitcode(status)
                )
                os.close(self._pidfd)
                self._pidfd = -1
            return self.returncode

    def _ended(self, timeout: float | None) -> bool:
        with self._lock:
            pidfd = self._pidfd
            if pidfd < 0:
                return True
            if timeout == 0:
                return bool(select.select([pidfd], [], [], 0)[0])
            own = os.dup(pidfd)  # waited on outside the lock: another thread may close ours
        try:
            return bool(select.select([own], [], [], timeout)[0])
        finally:
            os.close(own)

    def send_signal(self, sig: int) -> None:
        with self._lock:
            if self.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(self._pidfd, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __del__(self) -> None:
        if self._pidfd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._pidfd)


class ForkServer:
    """One server per worker process and device; started on the sandbox's spawner thread, so
    that it dies with that thread as an exec'd child would (``PR_SET_PDEATHSIG``)."""

    def __init__(self, env: dict[str, str], scratch: Path) -> None:
        self._control, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.log_path = scratch / "fork_server.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "kernelrl.env.sandbox.zygote", str(os.getpid())],
                cwd=scratch,
                env=env,
                stdin=server_end,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        server_end.close()
        self._lock = threading.Condition()
        self._statuses: dict[int, int] = {}
        self._replies: list[tuple[dict, list[int]]] = []
        self._gone = False
        self._reader = threading.Thread(target=self._read, name="kernelrl-fork-server", daemon=True)
        self._reader.start()
        self._reply(READY_TIMEOUT_S, "start")

    def alive(self) -> bool:
        with self._lock:
            return not self._gone and self.process.poll() is None

    def _read(self) -> None:
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self._control, 1 << 16, 1)
            except OSError:
                data, fds = b"", []
            with self._lock:
                if not data:
                    self._gone = True
                    self._lock.notify_all()
                    return
                message = json.loads(data)
                if message.get("type") == "exit":
                    self._statuses[int(message["pid"])] = int(message["status"])
                else:
                    self._replies.append((message, fds))
                self._lock.notify_all()

    def _reply(self, timeout: float, doing: str) -> tuple[dict, list[int]]:
        deadline = time.monotonic() + timeout
        with self._lock:
            while not self._replies and not self._gone and time.monotonic() < deadline:
                self._lock.wait(min(deadline - time.monotonic(), 0.5))
            if self._replies:
                return self._replies.pop(0)
        tail = self.log_path.read_text(errors="replace")[-1500:] if self.log_path.exists() else ""
        raise ForkServerError(f"fork server failed to {doing}\n{tail}")

    def fork(
        self, cwd: Path, env: dict[str, str], channel: socket.socket, log: int, entry: str = "child"
    ) -> ForkedProcess:
        """A new child in ``cwd`` with exactly ``env``, ``channel`` as its standard input and
        ``log`` as its output, running ``kernelrl.env.sandbox.<entry>`` (the child, or a compile
        companion). Called from one thread at a time (the spawner)."""
        request = json.dumps({"cwd": str(cwd), "env": env, "entry": entry}).encode()
        try:
            socket.send_fds(self._control, [request], [channel.fileno(), log])
        except OSError as exc:
            raise ForkServerError(f"fork server unreachable: {exc}") from exc
        message, fds = self._reply(30.0, "fork a child")
        if message.get("type") != "forked" or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise ForkServerError(f"fork server could not fork: {message.get('error', message)}")
        return ForkedProcess(int(message["pid"]), fds[0], self)

    def status_of(self, pid: int, wait_s: float) -> int | None:
        """The wait status of an ended child; None if the server is gone without telling."""
        deadline = time.monotonic() + wait_s
        with self._lock:
            while pid not in self._statuses and not self._gone:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._lock.wait(remaining)
            return self._statuses.pop(pid, None)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._control.shutdown(socket.SHUT_RDWR)
            self._control.close()
        self.process.kill()
        self.process.wait()
