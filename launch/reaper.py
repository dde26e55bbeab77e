"""A watchdog that kills what a process started once that process is gone, however it died.

Why: ``kernelrl env serve`` starts a local Ray. Killed with SIGKILL it cannot shut Ray down;
Ray's raylet and GCS follow their driver, but the raylet's agents (``ray::DashboardAgent``,
``ray::RuntimeEnvAgent``) are orphaned and stay. The watchdog is a separate process in its own
session (a Ctrl-C or a kill of the command's group does not reach it) that keeps a list of
every descendant of the watched process, refreshed twice a second from ``/proc``; when the
watched process has gone, it sends SIGTERM, then SIGKILL, to every listed process that still
runs (a pid is matched with its start time, so a reused pid is never hit), then exits.

    python -m kernelrl.launch.reaper PID      # or start_reaper() from the process itself

The same ending, given to a process that is still running, is ``stop_session``: how
``kernelrl topology`` stops the processes it started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["descendants", "start_reaper", "stop_session"]

Proc = tuple[int, int]  # (pid, start time in clock ticks since boot)


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of ``pid`` from /proc, None if it is gone or a zombie (it
    has exited; only its parent's wait is missing)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the name may hold spaces and ')'
    return None if fields[0] == "Z" else (int(fields[1]), int(fields[19]))


def _identity(pid: int) -> Proc | None:
    """``pid`` with its start time, None if it is not running."""
    stat = _stat(pid)
    return None if stat is None else (pid, stat[1])


def descendants(root: int) -> set[Proc]:
    """Every process below ``root`` now, with its start time."""
    children: dict[int, list[int]] = {}
    started: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = _stat(int(entry.name))
        if stat is not None:
            children.setdefault(stat[0], []).append(int(entry.name))
            started[int(entry.name)] = stat[1]
    found: set[Proc] = set()
    stack = list(children.get(root, []))
    while stack:
        pid = stack.pop()
        if pid in started and (pid, started[pid]) not in found:
            found.add((pid, started[pid]))
            stack.extend(children.get(pid, []))
    return found


def _alive(proc: Proc) -> bool:
    stat = _stat(proc[0])
    return stat is not None and stat[1] == proc[1]


def reap(root: int, poll_s: float = 0.5, grace_s: float = 5.0) -> int:
    """Watch ``root``; once it is gone, end its remembered descendants. Returns how many
    needed SIGKILL."""
    me = os.getpid()
    target = _identity(root)
    if target is None:
        return 0
    known: set[Proc] = set()
    while _alive(target):
        known |= {p for p in descendants(root) if p[0] != me}
        time.sleep(poll_s)
    return _end_processes(known, grace_s)


def _signal_each(procs: set[Proc], sig: int) -> None:
    for pid, _ in procs:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def _wait_gone(procs: set[Proc], within_s: float) -> set[Proc]:
    """Those of ``procs`` still running after up to ``within_s``."""
    deadline = time.monotonic() + within_s
    left = {p for p in procs if _alive(p)}
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = {p for p in left if _alive(p)}
    return left


def _end_processes(procs: set[Proc], grace_s: float) -> int:
    """SIGTERM to each of ``procs`` still running, SIGKILL to those left after ``grace_s``.
    Returns how many needed SIGKILL.

    Why wait for every one, not for a parent: a parent that exits at once on SIGTERM (vLLM's
    server) leaves its children still tearing down, and a SIGKILL then leaves behind what they
    were about to remove (their shared memory in /dev/shm)."""
    left = {p for p in procs if _alive(p)}
    _signal_each(left, signal.SIGTERM)
    left = _wait_gone(left, grace_s)
    _signal_each(left, signal.SIGKILL)
    _wait_gone(left, grace_s)
    return len(left)


def stop_session(process: subprocess.Popen, grace_s: float) -> None:
    """End ``process``, started in a session of its own, and everything it started: SIGTERM
    to its process group, then SIGKILL to what is left after ``grace_s``, the group and the
    descendants that left it (torchrun's ranks and Ray's workers have sessions of their own).
    The grace runs until the whole family is gone, not its leader alone (see ``_end_processes``)."""
    family = descendants(process.pid)
    if (leader := _identity(process.pid)) is not None:
        family.add(leader)
    _signal_group(process.pid, signal.SIGTERM)
    left = _wait_gone(family, grace_s)
    _signal_group(process.pid, signal.SIGKILL)  # what joined the group meanwhile
    _signal_each(left, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace_s)


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def start_reaper(pid: int | None = None) -> subprocess.Popen[bytes]:
    """Start the watchdog for ``pid`` (default: this process) in a session of its own."""
    return subprocess.Popen(
        [sys.executable, "-m", "kernelrl.launch.reaper", str(pid or os.getpid())],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


if __name__ == "__main__":
    reap(int(sys.argv[1]))
