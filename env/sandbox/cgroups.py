"""One cgroup v2 per sandbox child, so that every process of an evaluation is paused
(``cgroup.freeze``) and killed (``cgroup.kill``) as one, whatever it did to its session or
process group.

Why a cgroup rather than signals: membership is inherited on fork and only a write to the cgroup
filesystem moves a process out, which the sandbox's processes cannot make (the filesystem is
read-only in their mount namespace and their user is not root). The kernel freezes all members
together, so no member can wake another (SIGCONT) as it could while signals are sent one process
at a time, and ``cgroup.kill`` also reaches processes forked while it runs. Frozen processes are
still killed by ``cgroup.kill``, by their worker's death (``PR_SET_PDEATHSIG``) and by the end of
their PID namespace.

The worker makes the cgroup under its own and names it to the child in ``CGROUP_ENV``; the child
joins it itself (``join``) before it forks anything (``isolation``), so every process it ever
starts is inside. Where no cgroup v2 hierarchy is writable (a container without cgroup
delegation, a kernel older than 5.14 without ``cgroup.kill``) the worker passes the reason in
``UNAVAILABLE_ENV`` instead and ``child_process.Child`` reaches the processes by signals.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import threading
import time
from pathlib import Path

from kernelrl.env.sandbox.linux import process_exists

CGROUP_ENV = "KERNELRL_CGROUP"
UNAVAILABLE_ENV = "KERNELRL_CGROUP_UNAVAILABLE"
_PREFIX = "kernelrl-sbx-"
_NAME = re.compile(rf"{_PREFIX}(\d+)-(\d+|probe)")

_lock = threading.Lock()
_base: tuple[int, Path | None, str] | None = None  # (worker pid, directory or None, why not)
_counter = itertools.count()
_leftover: list[Path] = []  # cgroups whose processes were still dying at close


def _cgroup2_mount() -> tuple[str, str]:
    """(mount point, root of the hierarchy it shows) of the first cgroup v2 mount."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[fields.index("-") + 1] == "cgroup2":
                unescape = lambda s: re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), s)  # noqa: E731
                return unescape(fields[4]), unescape(fields[3])
    raise OSError("no cgroup v2 hierarchy is mounted")


def _own_directory() -> Path:
    """This process's cgroup v2 directory, where its children's cgroups are made."""
    point, root = _cgroup2_mount()
    path = ""
    with open("/proc/self/cgroup") as f:
        for line in f:
            if line.startswith("0::"):
                path = line[3:].strip()
    if not path:
        raise OSError("this process is in no cgroup v2 (/proc/self/cgroup)")
    relative = os.path.relpath(path, root)
    if relative.startswith(".."):
        raise OSError(f"our cgroup {path} is outside the mounted hierarchy {point}")
    return (Path(point) / relative).resolve()


def _sweep(base: Path) -> None:
    """Remove the cgroups of sandbox workers that died (a SIGKILLed worker cannot remove its
    own); their processes died with the worker, and any left are killed first."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(base):
            match = _NAME.fullmatch(entry.name)
            if match and not process_exists(int(match[1])):
                Cgroup(Path(entry.path)).remove(wait_s=1.0)


def _probe(base: Path) -> None:
    """Make and remove one cgroup: the hierarchy must let us freeze and kill, not only mkdir."""
    trial = base / f"{_PREFIX}{os.getpid()}-probe"
    trial.mkdir(exist_ok=True)
    try:
        missing = [n for n in ("cgroup.freeze", "cgroup.kill") if not (trial / n).exists()]
        if missing:
            raise OSError(f"no {' or '.join(missing)} (kernel older than 5.14?)")
        for name in ("cgroup.procs", "cgroup.freeze", "cgroup.kill"):
            if not os.access(trial / name, os.W_OK):
                raise OSError(f"{trial / name} is not writable")
    finally:
        with contextlib.suppress(OSError):
            trial.rmdir()


def _base_directory() -> tuple[Path | None, str]:
    """Where this worker makes its children's cgroups, or why it cannot; decided once per
    process (a forked worker decides again)."""
    global _base
    if _base is None or _base[0] != os.getpid():
        try:
            base = _own_directory()
            _probe(base)
            _sweep(base)
            _base = (os.getpid(), base, "")
        except OSError as exc:
            reason = exc.strerror if exc.strerror else str(exc)
            if exc.filename:
                reason += f": {exc.filename}"
            _base = (os.getpid(), None, f"no writable cgroup v2 hierarchy ({reason})")
    return _base[1], _base[2]


class Cgroup:
    """A sandbox child's cgroup, seen from its worker."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._holds_child = False

    def _write(self, name: str, value: str) -> None:
        with open(self.path / name, "w") as f:
            f.write(value)

    def _events(self) -> dict[str, str]:
        try:
            text = (self.path / "cgroup.events").read_text()
        except OSError:
            return {}
        return dict(line.split(" ", 1) for line in text.splitlines() if " " in line)

    def holds(self, pid: int) -> bool:
        """Whether ``pid`` (the child's first process) has joined: then all it starts is in.
        Once true it stays true: nothing in the sandbox can move a process out."""
        if not self._holds_child:
            with contextlib.suppress(OSError):
                self._holds_child = str(pid) in (self.path / "cgroup.procs").read_text().split()
        return self._holds_child

    def freeze(self, wait_s: float) -> bool:
        """Freeze every member; returns whether the kernel reports them all frozen within
        ``wait_s`` (a process inside a driver call freezes when it returns)."""
        self._write("cgroup.freeze", "1")
        deadline = time.monotonic() + wait_s
        while self._events().get("frozen") != "1":
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.002)
        return True

    def thaw(self) -> None:
        with contextlib.suppress(OSError):
            self._write("cgroup.freeze", "0")

    def frozen(self) -> bool:
        return self._events().get("frozen") == "1"

    def populated(self) -> bool:
        return self._events().get("populated") == "1"

    def kill(self) -> None:
        """SIGKILL to every member, frozen ones included, forks in flight included."""
        with contextlib.suppress(FileNotFoundError):
            if self.populated():
                self._write("cgroup.kill", "1")

    def remove(self, wait_s: float = 5.0) -> bool:
        """Kill what is left, wait until the members are gone, remove the cgroup; returns
        whether it is gone (if not, a later ``make`` retries)."""
        deadline = time.monotonic() + wait_s
        while True:
            with contextlib.suppress(OSError):
                self.kill()
            try:
                self.path.rmdir()
                return True
            except FileNotFoundError:
                return True
            except OSError:  # EBUSY: members still exiting
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.01)


def make() -> tuple[Cgroup | None, str]:
    """A new empty cgroup for one child, or None and why not."""
    with _lock:
        base, reason = _base_directory()
        if base is None:
            return None, reason
        for path in list(_leftover):
            if Cgroup(path).remove(wait_s=0):
                _leftover.remove(path)
        path = base / f"{_PREFIX}{os.getpid()}-{next(_counter)}"
        try:
            path.mkdir()
        except OSError as exc:
            return None, f"could not make a cgroup ({exc.strerror}: {path})"
        return Cgroup(path), ""


def release(cgroup: Cgroup) -> None:
    """Remove ``cgroup`` once its processes are gone; retried by ``make`` if they are slow."""
    if not cgroup.remove():
        with _lock:
            _leftover.append(cgroup.path)


def join() -> str:
    """In the child, before it forks: move this process into the cgroup its worker made (the
    child still has the worker's credentials); returns what it achieved, for the isolation
    report. The variables are removed: the solution has no use for them."""
    path = os.environ.pop(CGROUP_ENV, "")
    why_not = os.environ.pop(UNAVAILABLE_ENV, "the worker made none")
    fallback = "paused and killed by signals to each of its processes"
    if not path:
        return f"no cgroup ({why_not}): {fallback}"
    try:
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    except OSError as exc:
        return f"no cgroup (joining {path} failed: {exc.strerror}): {fallback}"
    return f"cgroup {path} (frozen and killed as one)"
