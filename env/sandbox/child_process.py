"""A sandboxed child seen from the worker: feeding it, watching its clock, its host memory and
(through the driver) its GPU memory, pausing and killing every process it has, and saying how
it ended."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelrl.env.sandbox import cgroups
from kernelrl.env.sandbox.device_ring import DeviceRing, DeviceRingUnavailable
from kernelrl.env.sandbox.fork_server import ForkedProcess
from kernelrl.env.sandbox.gpu_memory import GIB, GpuShare
from kernelrl.env.sandbox.protocol import (
    ProtocolError,
    recv_exactly_into,
    recv_message,
    send_message,
)
from kernelrl.env.sandbox.stream import OutputRing, Ring, send_rings


def _run_state(pid: int) -> tuple[str, int] | None:
    """State of ``pid`` and how many times it has been switched out (voluntary and not); None
    if it is gone. The count moves whenever the process runs, however briefly."""
    state, switches = "", 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("State:"):
                    state = line.split()[1]
                elif "ctxt_switches:" in line:  # voluntary_ and nonvoluntary_
                    switches += int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return (state, switches) if state else None


def _wait_gone(pids: list[int], wait_s: float) -> None:
    """Until none of ``pids`` runs any more (gone, or a zombie that holds nothing)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        states = [_run_state(pid) for pid in pids]
        if all(state is None or state[0] in "ZX" for state in states):
            return
        time.sleep(0.005)


class ChildDied(RuntimeError):
    """The child ended without answering; ``describe`` says how. ``ours``: it was killed by a
    failure on our side (its fork server died), not by anything the solution did."""

    def __init__(self, description: str, timed_out: bool = False, ours: bool = False) -> None:
        super().__init__(description)
        self.timed_out = timed_out
        self.ours = ours


def _closed_by_worker() -> ChildDied:
    """A read on a channel whose worker end the pool closed meanwhile (closing, or giving up on
    the child from another thread): the child is lost by our side, not by anything it did."""
    return ChildDied("its channel was closed by the worker", ours=True)


@dataclass(eq=False)  # a process handle: equal only to itself, hashable
class Child:
    process: ForkedProcess | subprocess.Popen
    sock: socket.socket
    scratch: Path
    started: float
    ring: Ring | None  # where its outputs' bytes come through (sandbox.stream); a compile
    # companion (sandbox.compiler) has none
    device_ring: DeviceRing | None = None  # or there, on the GPU, once it mapped it (device_ring)
    ready_info: dict[str, Any] = field(default_factory=dict)
    killed_for: str = ""
    cgroup: cgroups.Cgroup | None = None  # where the host allows one (sandbox.cgroups)
    paused_seconds: float = 0.0  # held paused while other evaluations were measured, in all
    _paused_since: float | None = field(default=None, init=False, repr=False)
    _stopped_by_signals: bool = field(default=False, init=False, repr=False)

    def send(self, message: dict[str, Any]) -> None:
        send_message(self.sock, message)

    def let_through(self, device_ring: DeviceRing | None = None) -> None:
        """Past the gate: the output rings first (the host ring, and ``device_ring`` where the
        worker could make one for this child), then the word to warm up."""
        fd = None
        if device_ring is not None:
            try:
                fd = device_ring.export()
            except DeviceRingUnavailable as exc:
                device_ring.close()
                device_ring = None
                self.ready_info["device_ring_refused"] = str(exc)
        try:
            send_rings(self.sock, self.ring, fd, device_ring.size if device_ring else 0)
        except BaseException:
            if device_ring is not None:
                device_ring.close()
            raise
        finally:
            if fd is not None:
                os.close(fd)
        self.device_ring = device_ring
        self.send({"type": "warm"})

    def take_ready(self, message: dict[str, Any]) -> None:
        """The child's ready message, from our code alone: a device ring it could not map is
        given back at once."""
        self.ready_info.update(message)
        if self.device_ring is not None and message.get("output_ring") != "device":
            self.device_ring.close()
            self.device_ring = None

    @property
    def output_ring(self) -> OutputRing:
        """The ring the child's outputs come through, as its ready message chose it."""
        return self.device_ring if self.device_ring is not None else self.ring

    def send_token(self, token: bytes, deadline: float) -> None:
        """A token of the output stream, written by ``deadline``: a child that reads none (its
        tokens fill the channel) is killed for its time limit, not left holding the worker's
        thread; a child gone meanwhile is reported as any death is."""
        self.sock.settimeout(max(deadline - time.monotonic(), 0.05))
        try:
            self.sock.sendall(token)
        except TimeoutError:
            self.kill("timeout")
            raise ChildDied("exceeded the time limit and was killed", timed_out=True) from None
        except OSError:
            raise self.died() from None
        finally:
            self.sock.settimeout(None)

    def receive(
        self, deadline: float, max_rss_bytes: int | None = None, gpu: GpuShare | None = None
    ) -> dict[str, Any]:
        """Next message, watching the clock and the child's memory (host, and with ``gpu`` its
        share of the GPU) while waiting."""
        self._wait_readable(deadline, max_rss_bytes, gpu)
        with self._reading():
            try:
                return recv_message(self.sock)
            except ProtocolError as exc:
                self.kill("protocol")
                raise ChildDied(f"sent a malformed message ({exc})") from None

    def receive_into(
        self,
        buffer: memoryview,
        deadline: float,
        max_rss_bytes: int | None = None,
        gpu: GpuShare | None = None,
    ) -> None:
        """Raw bytes that follow a message (a tensor's chunk), under the same watch."""
        self._wait_readable(deadline, max_rss_bytes, gpu)
        with self._reading():
            self.sock.settimeout(max(deadline - time.monotonic(), 0.05))
            try:
                recv_exactly_into(self.sock, buffer)
            except TimeoutError:
                self.kill("timeout")
                raise ChildDied("exceeded the time limit and was killed", timed_out=True) from None
            finally:
                self.sock.settimeout(None)

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """A read on the channel: its end is the child's death, or the channel closed by the
        pool from another thread after the wait for it (ours)."""
        try:
            yield
        except (EOFError, ConnectionError):
            raise self.died() from None
        except OSError:
            if self.sock.fileno() != -1:
                raise
            raise _closed_by_worker() from None

    def _wait_readable(
        self, deadline: float, max_rss_bytes: int | None, gpu: GpuShare | None = None
    ) -> None:
        while True:
            self._watch_gpu(gpu)  # also when messages come fast: it looks every 0.2 s at most
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill("timeout")
                raise ChildDied("exceeded the time limit and was killed", timed_out=True)
            try:
                readable, _, _ = select.select([self.sock], [], [], min(remaining, 0.2))
            except (ValueError, OSError):
                raise _closed_by_worker() from None
            if readable:
                return
            if self.process.poll() is not None:
                raise self.died()
            if max_rss_bytes and self.rss_bytes() > max_rss_bytes:
                self.kill("memory")
                raise ChildDied(
                    f"exceeded the host memory limit of {max_rss_bytes / 2**30:.1f} GiB"
                )

    def _watch_gpu(self, gpu: GpuShare | None) -> None:
        """Kill a child that holds more GPU memory than was admitted for it: memory promised
        to other evaluations, whose out-of-memory errors would otherwise read as ours."""
        if gpu is None:
            return
        held = gpu.over_share(self.pids)
        if held is not None:
            self.kill("gpu memory")
            raise ChildDied(
                f"held {held / GIB:.2f} GiB of GPU memory, more than the {gpu.admitted / GIB:.2f} "
                "GiB admitted for this evaluation, and was killed"
            )

    def pids(self) -> list[int]:
        """The ids, in this process's PID namespace, of every process of the child."""
        return self._tree()

    def _tree(self) -> list[int]:
        """The child's process and all its descendants: with a PID namespace the process we
        started is a thin waiter and the solution runs two levels below it
        (sandbox.isolation)."""
        found, pending = [], [self.process.pid]
        while pending:
            pid = pending.pop()
            if pid in found:
                continue
            found.append(pid)
            with contextlib.suppress(OSError, ValueError):
                for tasks in os.scandir(f"/proc/{pid}/task"):
                    with open(f"{tasks.path}/children") as children:
                        pending.extend(int(c) for c in children.read().split())
        return found

    def rss_bytes(self) -> int:
        """Resident memory of the child's processes together, whatever the solution forked."""
        total = 0
        for pid in self._tree():
            with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        return total

    def died(self) -> ChildDied:
        description = self.describe_exit()
        return ChildDied(description, ours=getattr(self.process, "lost_with_server", False))

    def describe_exit(self) -> str:
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill("hung after closing its channel")
            return "closed its channel and hung; killed"
        if self.killed_for == "memory":
            return "exceeded the memory limit and was killed"
        if self.killed_for == "gpu memory":
            return "held more GPU memory than was admitted for it and was killed"
        if self.killed_for == "start timeout":
            return "did not finish its start in time and was killed"
        if getattr(self.process, "lost_with_server", False):
            return "was killed because its fork server died (a failure of the sandbox)"
        if code < 0:
            name = signal.Signals(-code).name
            meaning = {
                "SIGSEGV": "segmentation fault",
                "SIGBUS": "bus error",
                "SIGABRT": "aborted",
                "SIGKILL": "killed (out of memory?)",
                "SIGXCPU": "CPU time limit exceeded",
                "SIGXFSZ": "file size limit exceeded",
                "SIGFPE": "arithmetic fault",
                "SIGILL": "illegal instruction",
            }.get(name, "terminated by a signal")
            return f"crashed with {name} ({meaning})"
        return f"exited with code {code} before reporting a result"

    def output_tail(self, limit: int = 1500) -> str:
        try:
            text = (self.scratch / "child.log").read_text(errors="replace")
        except OSError:
            return ""
        return text[-limit:]

    def _contained(self) -> bool:
        """Whether the child's cgroup holds it, and so everything it started."""
        return self.cgroup is not None and self.cgroup.holds(self.process.pid)

    def pause(self, wait_s: float = 1.0, for_others: bool = True) -> None:
        """Stop every process of the child, whatever it did to its session or group, so that
        it launches no GPU work while another evaluation is measured; returns once all are
        stopped, or after ``wait_s``. Only a pause ``for_others`` counts in
        ``paused_seconds``: one for the child's own evaluation (its reference timed) is not
        time its evaluation lost to others.

        Its cgroup is frozen where the host allows one: the kernel stops all members at once.
        Otherwise (or before the child has joined its cgroup, while it runs only our code)
        each process of the child's tree gets SIGSTOP: with a PID namespace that tree is the
        whole namespace, since the namespace's init inherits every orphan (double fork)."""
        if self.process.poll() is not None:
            return
        if for_others and self._paused_since is None:
            self._paused_since = time.monotonic()
        if self._contained():
            assert self.cgroup is not None
            with contextlib.suppress(OSError):
                self.cgroup.freeze(wait_s)
                return
        self._stopped_by_signals = True
        self._stop_all(wait_s)

    def _stop_all(self, wait_s: float) -> None:
        """SIGSTOP to every process of the tree until two walks in a row find the same
        processes, all stopped, none of which ran in between: a process forked or woken
        (SIGCONT from a sibling) during a walk shows in the next one and is stopped again."""
        deadline = time.monotonic() + wait_s
        previous: dict[int, tuple[str, int]] | None = None
        while self.process.poll() is None:
            seen: dict[int, tuple[str, int]] = {}
            for pid in self._tree():
                state = _run_state(pid)
                if state is None:
                    continue
                if state[0] not in "TtZX":
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGSTOP)
                seen[pid] = state
            stopped = all(state in "TtZX" for state, _ in seen.values())
            if (stopped and seen == previous) or time.monotonic() >= deadline:
                return
            previous = seen if stopped else None
            time.sleep(0.002)

    def resume(self) -> None:
        if self._paused_since is not None:
            self.paused_seconds += time.monotonic() - self._paused_since
            self._paused_since = None
        if self.cgroup is not None:
            self.cgroup.thaw()
        if self._stopped_by_signals:
            self._stopped_by_signals = False
            self._signal_all(signal.SIGCONT)

    def _signal_all(self, sig: signal.Signals) -> None:
        """``sig`` to the child's process group and to every process of its tree, the child's
        own process included: a forked child is nobody's group leader until its first step
        (setsid) has run, and one stopped before that would never be continued."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, sig)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                self.process.send_signal(sig)
        for pid in self._tree()[1:]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def paused(self) -> bool:
        """Whether every process of the child is stopped now (frozen, or in state T)."""
        if self._contained():
            assert self.cgroup is not None
            return self.cgroup.frozen()
        states = [_run_state(pid) for pid in self._tree()]
        return all(state[0] in "TtZX" for state in states if state)

    def kill(self, reason: str = "") -> None:
        """SIGKILL to every process of the child: its cgroup (all of it at once), its process
        group and its tree (the PID namespace's init among them, whose death ends the rest).
        The process we started dies by SIGKILL, which ``describe_exit`` reports as today."""
        members = self.send_kill(reason)
        _wait_gone(members, 10)  # the namespace's teardown outlasts the waiter's death
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)

    def send_kill(self, reason: str = "") -> list[int]:
        """``kill`` without the wait: the signals are sent (a killed process runs none of its
        own code again), their exits, CUDA context teardown included, may take a while.
        Returns the tree's other processes, for the wait."""
        self.killed_for = self.killed_for or reason
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                self.cgroup.kill()
        if self.process.poll() is not None:
            return []
        members = self._tree()[1:]
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            self.process.kill()
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        return members

    def close(self) -> None:
        """Kill what is left of the child and remove all it had: its cgroup (once every
        member is gone) and its scratch directory."""
        self.kill()
        if self.cgroup is not None:
            cgroups.release(self.cgroup)
        self.sock.close()
        if self.ring is not None:
            self.ring.close()
        if self.device_ring is not None:
            self.device_ring.close()
        shutil.rmtree(self.scratch, ignore_errors=True)
