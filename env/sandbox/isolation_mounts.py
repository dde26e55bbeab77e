"""Mount helpers of the child's filesystem (``isolation_view``), and the host view it falls back
to where the host refuses a root of the child's own: the host's tree with every mount read-only
and nosuid, a private tmpfs over ``/tmp`` and ``/dev/shm``, the scratch directory writable, its
own ``/proc``, and what a user who is not root needs made reachable. That view stops writes,
not connections to the host's Unix socket files: its report says so."""

from __future__ import annotations

import contextlib
import os
import re
import stat

from kernelrl.env.sandbox.linux import (
    MS_BIND,
    MS_NOATIME,
    MS_NODEV,
    MS_NODIRATIME,
    MS_NOEXEC,
    MS_NOSUID,
    MS_RDONLY,
    MS_REC,
    MS_RELATIME,
    MS_REMOUNT,
    MS_STRICTATIME,
    mount,
)

PRIVATE_TMPFS_BYTES = 64 * 2**20
PRIVATE_TMPFS = ("/tmp", "/dev/shm")


def _mount_points() -> list[tuple[str, str]]:
    """(mount point, filesystem type) of every mount, outermost first, duplicates once."""
    points: dict[str, str] = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            fstype = fields[fields.index("-") + 1]
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[4])  # \040
            points[point] = fstype
    return sorted(points.items(), key=lambda item: item[0].count("/"))


def flags_of(path: str) -> int:
    """The mount flags of the mount at ``path``, as mount(2) flags (a bind remount must keep
    those that a user namespace locks: nosuid, nodev, noexec, atime)."""
    vfs = os.statvfs(path).f_flag
    flags = 0
    for st, ms in (
        (os.ST_RDONLY, MS_RDONLY),
        (os.ST_NOSUID, MS_NOSUID),
        (os.ST_NODEV, MS_NODEV),
        (os.ST_NOEXEC, MS_NOEXEC),
        (os.ST_NOATIME, MS_NOATIME),
        (os.ST_NODIRATIME, MS_NODIRATIME),
        (os.ST_RELATIME, MS_RELATIME),
    ):
        if vfs & st:
            flags |= ms
    if not vfs & (os.ST_NOATIME | os.ST_RELATIME):
        flags |= MS_STRICTATIME
    return flags


def _expose_needed(paths: list[str]) -> list[str]:
    """Make what the child needs reachable for a user who is not root, hiding the rest.

    A directory nobody but root may enter (``/root``, mode 700, where pyenv, conda or a venv
    often live) on the way to the interpreter or a package gets a tmpfs of our own (mode 755)
    mounted over it, into which only the needed entries are bound back. Returns the
    directories so covered."""
    wanted: dict[str, set[str]] = {}
    for path in {os.path.realpath(p) for p in paths}:
        parts = path.strip("/").split("/")
        for depth in range(len(parts) - 1):
            ancestor = "/" + "/".join(parts[:depth])
            if not os.stat(ancestor).st_mode & 0o001:  # others may not enter it
                wanted.setdefault(ancestor, set()).add(parts[depth])
                break
    for ancestor, entries in sorted(wanted.items()):
        handles = {e: os.open(os.path.join(ancestor, e), os.O_PATH) for e in entries}
        try:
            mount("tmpfs", ancestor, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
            for entry, fd in handles.items():
                target = os.path.join(ancestor, entry)
                if stat.S_ISDIR(os.fstat(fd).st_mode):
                    os.mkdir(target)
                else:
                    open(target, "w").close()
                mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
        finally:
            for fd in handles.values():
                os.close(fd)
    return sorted(wanted)


def _mount_own_proc() -> None:
    """A fresh /proc showing this PID namespace only, with the host's mounts inside /proc bound
    back read-only on top: a container's masks (/proc/kcore, /proc/keys...) and the NVIDIA
    container toolkit's /proc/driver/nvidia stay as the rest of the host sees them."""
    handles = []
    for point, fstype in _mount_points():
        if point.startswith("/proc/") and fstype != "autofs":
            with contextlib.suppress(OSError):
                handles.append((point, os.open(point, os.O_PATH)))
    try:
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        for point, fd in handles:
            with contextlib.suppress(OSError):
                mount(f"/proc/self/fd/{fd}", point, None, MS_BIND)
                flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | flags_of(point)
                mount(None, point, None, flags)
    finally:
        for _, fd in handles:
            os.close(fd)


def _open_code_under(point: str, needed: list[str]) -> dict[str, int]:
    """Code the child imports that lives under ``point`` (a checkout or carried packages in
    /tmp), held open so that it can be bound back once a private tmpfs covers ``point``."""
    inside = {
        real
        for real in (os.path.realpath(p) for p in needed)
        if real.startswith(point.rstrip("/") + "/") and os.path.isdir(real)
    }
    return {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path in sorted(inside)}


def _bind_back_read_only(kept: dict[str, int]) -> None:
    for path, fd in kept.items():
        os.makedirs(path, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | flags_of(path))


def read_only_everywhere() -> list[str]:
    """Remount every mount of this namespace read-only and nosuid (autofs and /proc's own
    aside); returns the mount points that refused."""
    left_writable = []
    for point, fstype in _mount_points():
        if fstype == "autofs" or point.startswith("/proc/"):  # never trigger an automount
            continue
        try:
            mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | flags_of(point))
        except OSError:
            if os.path.exists(point):
                left_writable.append(point)
    return left_writable


def proc_submounts() -> list[str]:
    """The host's mounts inside /proc (a container's masks, /proc/driver/nvidia)."""
    return [p for p, fstype in _mount_points() if p.startswith("/proc/") and fstype != "autofs"]


def confine_host_view(scratch: str, scratch_fd: int, own_proc: bool, needed: list[str]) -> str:
    """The host's tree, already read-only (``read_only_everywhere``): private /tmp and
    /dev/shm, scratch (``scratch_fd``) bound back writable, own /proc; the ``needed`` paths
    reachable for a user who is not root."""
    covered = _expose_needed(needed)
    private = []
    for point in PRIVATE_TMPFS:
        if os.path.isdir(point) and not os.path.islink(point):
            kept = _open_code_under(point, needed)
            options = f"size={PRIVATE_TMPFS_BYTES},mode=1777"
            try:
                mount("tmpfs", point, "tmpfs", MS_NOSUID | MS_NODEV, options)
                _bind_back_read_only(kept)
            finally:
                for fd in kept.values():
                    os.close(fd)
            private.append(point)
    if not os.path.isdir(scratch):
        os.makedirs(scratch)
    mount(f"/proc/self/fd/{scratch_fd}", scratch, None, MS_BIND)
    keep = flags_of(scratch) & ~MS_RDONLY
    mount(None, scratch, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | keep)
    os.chdir(scratch)  # the old cwd is the read-only mount underneath
    proc = "host /proc (read-only)"
    if own_proc:
        try:
            _mount_own_proc()
            proc = "own /proc"
        except OSError as exc:
            proc = f"host /proc (read-only; own /proc failed: {exc.strerror})"
    text = "read-only except the scratch dir (host view)"
    text += f"; private tmpfs on {', '.join(private) or 'nothing'}; {proc}"
    if covered:
        text += f"; only what the child needs left in {', '.join(covered)}"
    return text
