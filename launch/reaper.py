"""A watchdog that kills what a process started once that process is gone, however it died.

Why: ``kernelrl env serve`` starts a local Ray. Killed with SIGKILL it cannot shut Ray down;
Ray's raylet and GCS follow their driver, but the raylet's agents (``ray::DashboardAgent``,
``ray::RuntimeEnvAgent``) are orphaned and stay. The watchdog is a separate process in its own
session (a Ctrl-C or a kill of the command's group does not reach it) that keeps a list of
every descendant of the watched process, refreshed twice a second from ``/proc``; when the
watched process has gone, it sends SIGTERM, then SIGKILL, to every listed process that still
runs (a pid is matched with its start time, so a reused pid is never hit), then exits.

    python -m kernelrl.launch.reaper PID      # or start_reaper() from the process itself
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["descendants", "start_reaper"]

Proc = tuple[int, int]  # (pid, start time in clock ticks since boot)


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of ``pid`` from /proc, None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the name may hold spaces and ')'
    return int(fields[1]), int(fields[19])


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
    were still running."""
    me = os.getpid()
    identity = _stat(root)
    if identity is None:
        return 0
    target: Proc = (root, identity[1])
    known: set[Proc] = set()
    while _alive(target):
        known |= {p for p in descendants(root) if p[0] != me}
        time.sleep(poll_s)
    left = {p for p in known if _alive(p)}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid, _ in left:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_alive(p) for p in left):
            time.sleep(0.1)
        left = {p for p in left if _alive(p)}
        if not left:
            break
    return len(left)


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
