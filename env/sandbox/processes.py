"""Spawning, feeding and killing sandboxed children; keeping warm ones ready.

Process start, ``import torch`` and CUDA context creation cost seconds, more than compiling and
checking a small kernel. A ``ChildPool`` therefore starts the next children while the current
evaluation runs; each child still serves exactly one solution and is then killed.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelrl.env.sandbox import cgroups
from kernelrl.env.sandbox.protocol import (
    ProtocolError,
    recv_exactly_into,
    recv_message,
    send_message,
)

# Only these variables reach the child: no credentials (WANDB_API_KEY, HF_TOKEN, ...) leak in.
_PASSED_ENV = (
    "PATH",
    "LANG",
    "LC_ALL",
    "CUDA_HOME",
    "CUDA_PATH",
    "LD_LIBRARY_PATH",
    "TRITON_PTXAS_PATH",
)


def _scratch_root() -> str | None:
    """tmpfs when it has room: outputs travel through files there."""
    shm = Path("/dev/shm")
    try:
        if shm.is_dir() and shutil.disk_usage(shm).free > 8 * 1024**3:
            return str(shm)
    except OSError:
        pass
    return None


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
    """The child ended without answering; ``describe`` says how."""

    def __init__(self, description: str, timed_out: bool = False) -> None:
        super().__init__(description)
        self.timed_out = timed_out


@dataclass(eq=False)  # a process handle: equal only to itself, hashable
class Child:
    process: subprocess.Popen
    sock: socket.socket
    scratch: Path
    started: float
    ready_info: dict[str, Any] = field(default_factory=dict)
    killed_for: str = ""
    cgroup: cgroups.Cgroup | None = None  # where the host allows one (sandbox.cgroups)
    _stopped_by_signals: bool = field(default=False, init=False, repr=False)

    def send(self, message: dict[str, Any]) -> None:
        send_message(self.sock, message)

    def receive(self, deadline: float, max_rss_bytes: int | None = None) -> dict[str, Any]:
        """Next message, watching the clock and the child's memory while waiting."""
        self._wait_readable(deadline, max_rss_bytes)
        try:
            return recv_message(self.sock)
        except (EOFError, ConnectionError):
            raise ChildDied(self.describe_exit()) from None
        except ProtocolError as exc:
            self.kill("protocol")
            raise ChildDied(f"sent a malformed message ({exc})") from None

    def receive_into(
        self, buffer: memoryview, deadline: float, max_rss_bytes: int | None = None
    ) -> None:
        """Raw bytes that follow a message (a tensor's chunk), under the same watch."""
        self._wait_readable(deadline, max_rss_bytes)
        self.sock.settimeout(max(deadline - time.monotonic(), 0.05))
        try:
            recv_exactly_into(self.sock, buffer)
        except TimeoutError:
            self.kill("timeout")
            raise ChildDied("exceeded the time limit and was killed", timed_out=True) from None
        except (EOFError, ConnectionError):
            raise ChildDied(self.describe_exit()) from None
        finally:
            self.sock.settimeout(None)

    def _wait_readable(self, deadline: float, max_rss_bytes: int | None) -> None:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill("timeout")
                raise ChildDied("exceeded the time limit and was killed", timed_out=True)
            readable, _, _ = select.select([self.sock], [], [], min(remaining, 0.2))
            if readable:
                return
            if self.process.poll() is not None:
                raise ChildDied(self.describe_exit())
            if max_rss_bytes and self.rss_bytes() > max_rss_bytes:
                self.kill("memory")
                raise ChildDied(
                    f"exceeded the host memory limit of {max_rss_bytes / 2**30:.1f} GiB"
                )

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

    def describe_exit(self) -> str:
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill("hung after closing its channel")
            return "closed its channel and hung; killed"
        if self.killed_for == "memory":
            return "exceeded the memory limit and was killed"
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

    def pause(self, wait_s: float = 1.0) -> None:
        """Stop every process of the child, whatever it did to its session or group, so that
        it launches no GPU work while another evaluation is measured; returns once all are
        stopped, or after ``wait_s``.

        Its cgroup is frozen where the host allows one: the kernel stops all members at once.
        Otherwise (or before the child has joined its cgroup, while it runs only our code)
        each process of the child's tree gets SIGSTOP: with a PID namespace that tree is the
        whole namespace, since the namespace's init inherits every orphan (double fork)."""
        if self.process.poll() is not None:
            return
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
        if self.cgroup is not None:
            self.cgroup.thaw()
        if self._stopped_by_signals:
            self._stopped_by_signals = False
            self._signal_all(signal.SIGCONT)

    def _signal_all(self, sig: signal.Signals) -> None:
        """``sig`` to the child's process group and to every process of its tree."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, sig)
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
        self.killed_for = self.killed_for or reason
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                self.cgroup.kill()
        if self.process.poll() is None:
            members = self._tree()[1:]
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.process.kill()
            for pid in members:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            _wait_gone(members, 10)  # the namespace's teardown outlasts the waiter's death
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)

    def close(self) -> None:
        """Kill what is left of the child and remove all it had: its cgroup (once every
        member is gone) and its scratch directory."""
        self.kill()
        if self.cgroup is not None:
            cgroups.release(self.cgroup)
        self.sock.close()
        shutil.rmtree(self.scratch, ignore_errors=True)


_spawner: tuple[int, ThreadPoolExecutor] | None = None
_spawner_lock = threading.Lock()


def spawn_child(device: str, gpu_index: int | None) -> Child:
    """A new child, forked by this process's one spawner thread.

    The child asks the kernel for SIGKILL when the thread that forked it ends
    (``PR_SET_PDEATHSIG`` is per thread, not per process): forked by an evaluation's thread, a
    child would die with that thread. The spawner thread lives until the process exits."""
    global _spawner
    with _spawner_lock:
        if _spawner is None or _spawner[0] != os.getpid():  # a forked process starts its own
            _spawner = (os.getpid(), ThreadPoolExecutor(1, "kernelrl-sandbox-spawner"))
        spawner = _spawner[1]
    return spawner.submit(_spawn_child, device, gpu_index).result()


def _spawn_child(device: str, gpu_index: int | None) -> Child:
    scratch = Path(tempfile.mkdtemp(prefix="kernelrl-sbx-", dir=_scratch_root()))
    parent_sock, child_sock = socket.socketpair()
    env = {key: os.environ[key] for key in _PASSED_ENV if key in os.environ}
    env.update(
        HOME=str(scratch),
        TMPDIR=str(scratch),
        TRITON_CACHE_DIR=str(scratch / "triton"),
        TORCH_EXTENSIONS_DIR=str(scratch / "torch_extensions"),
        PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONUNBUFFERED="1",
        KERNELRL_DEVICE=device,
        OMP_NUM_THREADS="1",
    )
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    else:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu_index if gpu_index is not None else 0)
    cgroup, why_not = cgroups.make()
    if cgroup is not None:
        env[cgroups.CGROUP_ENV] = str(cgroup.path)
    else:
        env[cgroups.UNAVAILABLE_ENV] = why_not
    log = open(scratch / "child.log", "wb")  # noqa: SIM115 - handed to the child
    try:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kernelrl.env.sandbox.child",
                "stdin",  # the protocol socket: named by neither argv nor the environment
                str(os.getpid()),
            ],
            cwd=scratch,
            env=env,
            stdin=child_sock,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: a kill takes all it spawned
        )
    except BaseException:
        if cgroup is not None:
            cgroups.release(cgroup)
        raise
    finally:
        log.close()
        child_sock.close()
    return Child(
        process=process,
        sock=parent_sock,
        scratch=scratch,
        started=time.monotonic(),
        cgroup=cgroup,
    )


class ChildPool:
    """Keeps ``spare`` children warming up so that evaluations rarely wait for one.

    A new child first isolates itself and imports torch, Triton and the harness: CPU work that
    touches no GPU. It then stops at a gate (it says ``imported`` and waits) until this pool
    lets it make its CUDA context and start CUPTI, never during a measurement. A measurement
    pauses every other child; with ``pause_importing=False`` those still importing run on
    (they cannot pass the gate before it ends), so the host's cores go on starting children
    instead of idling. Off by default: timing steadiness comes first (benchmarks/README.md,
    issue 27).
    """

    def __init__(
        self,
        device: str,
        gpu_index: int | None = None,
        spare: int = 1,
        ready_timeout_s: float = 180.0,
        pause_importing: bool = True,
    ) -> None:
        """``pause_importing``: pause children still importing during a measurement too (they
        are held at the gate either way); False lets them use the host's cores meanwhile."""
        self.device = device
        self.pause_importing = pause_importing
        self.gpu_index = gpu_index
        self.spare = max(spare, 0)
        self.ready_timeout_s = ready_timeout_s
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._warming: list[Child] = []
        self._live: set[Child] = set()  # every child spawned here and not yet ended
        self._gated: set[Child] = set()  # spawned, not yet let through the gate
        self._gate_errors: dict[Child, str] = {}
        self._at_gate: set[Child] = set()  # imported, waiting for a measurement to end
        self._gatekeeper: threading.Thread | None = None
        self._pausing = False
        self._closed = False

    def _spawn(self) -> Child:
        """Called with the lock held. The child starts importing, held at the gate."""
        child = spawn_child(self.device, self.gpu_index)
        self._live = {c for c in self._live if c.process.poll() is None} | {child}
        self._gated.add(child)
        if self._pausing and self.pause_importing:
            child.pause()
        if self._gatekeeper is None:
            self._gatekeeper = threading.Thread(
                target=self._keep_gate, name="kernelrl-sandbox-gate", daemon=True
            )
            self._gatekeeper.start()
        self._changed.notify_all()
        return child

    def _keep_gate(self) -> None:
        """Lets each child that has imported through the gate, never during a measurement."""
        while True:
            with self._lock:
                while not self._gated and not self._closed:
                    self._changed.wait(0.5)
                if self._closed:
                    return
                gated = list(self._gated)
            try:
                readable, _, _ = select.select([c.sock for c in gated], [], [], 0.05)
            except (OSError, ValueError):  # a socket closed meanwhile (acquire gave up on it)
                time.sleep(0.01)
                continue
            for child in (c for c in gated if c.sock in readable):
                self._pass_gate(child)

    def _pass_gate(self, child: Child) -> None:
        try:
            message = child.receive(time.monotonic() + 5.0)
            error = (
                ""
                if message.get("type") == "imported"
                else f"sent {message.get('type')!r} instead of 'imported'"
            )
        except ChildDied as exc:
            message, error = {}, f"failed to start: {exc}"
        with self._lock:
            self._at_gate.add(child)
            while self._pausing and not self._closed:
                self._changed.wait()
            self._at_gate.discard(child)
            if child in self._gated and not error:
                child.ready_info.update(message)
                try:
                    child.send({"type": "warm"})
                except OSError as exc:
                    error = f"could not be let through the gate: {exc}"
            if error:
                self._gate_errors[child] = error
            self._gated.discard(child)
            self._changed.notify_all()

    def _top_up(self) -> None:
        while len(self._warming) < self.spare and not self._closed:
            self._warming.append(self._spawn())

    @contextlib.contextmanager
    def paused_except(self, kept: Child) -> Iterator[bool]:
        """Every other child of this pool that may touch the GPU paused (``Child.pause``: all
        of its processes) while the block runs; children still importing are held at the
        gate instead, those spawned meanwhile included; yields whether any was paused.

        All of them are told to stop first and waited for after, so that the pause costs one
        child's freeze, not the sum of them."""
        with self._lock:
            self._pausing = True
            held = set() if self.pause_importing else self._gated
            others = [c for c in self._live - {kept} - held if c.process.poll() is None]
            for child in others:
                child.pause(wait_s=0.0)
            for child in others:
                child.pause()
        try:
            yield bool(others)
        finally:
            with self._lock:
                self._pausing = False
                for child in self._live - {kept}:
                    child.resume()
                self._changed.notify_all()

    def acquire(self) -> Child:
        """A child that has imported torch, made its CUDA context and said 'ready'."""
        for _ in range(3):
            with self._lock:
                if self._closed:
                    raise RuntimeError("child pool is closed")
                child = self._warming.pop(0) if self._warming else self._spawn()
                self._top_up()
                deadline = time.monotonic() + self.ready_timeout_s
                while child in self._gated and not self._closed:
                    if time.monotonic() >= deadline:
                        break
                    self._changed.wait(min(deadline - time.monotonic(), 1.0))
                stuck = child in self._gated
                self._gated.discard(child)
                gate_error = self._gate_errors.pop(child, "")
            if stuck or gate_error:
                log = child.output_tail()
                child.close()
                why = gate_error or "did not finish its imports in time"
                last_error = f"sandbox child {why}\n{log}"
                continue
            try:
                message = child.receive(deadline)
            except ChildDied as exc:
                log = child.output_tail()
                child.close()
                last_error = f"sandbox child failed to start: {exc}\n{log}"
                continue
            if message.get("type") == "ready":
                child.ready_info.update(message)
                return child
            child.close()
            last_error = f"sandbox child sent {message.get('type')!r} instead of 'ready'"
        raise RuntimeError(last_error)

    def warm(self) -> None:
        with self._lock:
            self._top_up()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            children, self._warming = self._warming, []
            self._gated.clear()
            self._changed.notify_all()
        for child in children:
            child.close()
