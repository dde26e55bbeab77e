"""Scratch folders of the sandbox (children's homes, the fork server's, the Triton seed), named
after the worker that made them so that a later worker can remove those of one that died.

A worker removes its scratch folders itself (a child's when it is reaped, the others at exit),
but a worker killed by SIGKILL or the OOM killer cannot, and on tmpfs what it left holds
memory until the machine restarts. Each folder's name carries the worker's PID namespace and
PID; a worker sweeps, once, the folders of workers of its own PID namespace that no longer
exist. Folders of another namespace are never touched: their owners' PIDs mean nothing here;
nor is anything in the shared folder that is not a folder of this user or, for a worker running
as root, of a sandbox user (a child's home is handed to the child's own uid) — another user's,
planted under a dead worker's name, or a symbolic link to somewhere else, stays.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
import threading
from pathlib import Path

from kernelrl.env.sandbox.isolation_user import SANDBOX_UIDS
from kernelrl.env.sandbox.linux import process_exists

PREFIX = "kernelrl-"
_NAME = re.compile(rf"{PREFIX}[a-z-]+?-(\d+)-(\d+)-")
_swept_by: int | None = None
_lock = threading.Lock()


def scratch_root() -> str | None:
    """tmpfs when it has room: outputs travel through files there."""
    shm = Path("/dev/shm")
    try:
        if shm.is_dir() and shutil.disk_usage(shm).free > 8 * 1024**3:
            return str(shm)
    except OSError:
        pass
    return None


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def make_scratch(kind: str) -> Path:
    """A new folder for ``kind`` (e.g. ``sbx``), named after this worker; the first call of a
    process also sweeps what dead workers left."""
    sweep_orphans()
    prefix = f"{PREFIX}{kind}-{_pid_namespace()}-{os.getpid()}-"
    return Path(tempfile.mkdtemp(prefix=prefix, dir=scratch_root()))


def _owned_by_us(uid: int) -> bool:
    """This user's, or (as root, which hands each child's home to the child's uid) a child's."""
    return uid == os.geteuid() or (os.geteuid() == 0 and uid in SANDBOX_UIDS)


def sweep_orphans(root: str | None = None) -> list[Path]:
    """Remove the scratch folders of this PID namespace's workers that no longer run; once per
    process unless ``root`` is given. Returns what was removed."""
    global _swept_by
    with _lock:
        if root is None:
            if _swept_by == os.getpid():
                return []
            _swept_by = os.getpid()
    base = Path(root or scratch_root() or tempfile.gettempdir())
    namespace = str(_pid_namespace())
    removed = []
    for path in base.glob(f"{PREFIX}*"):
        match = _NAME.match(path.name)
        if match is None or match[1] != namespace or process_exists(int(match[2])):
            continue
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or not _owned_by_us(info.st_uid):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed
