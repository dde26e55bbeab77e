"""Which kernelrl evaluators on this host use the same GPU.

A measurement trusts that the GPU runs only the kernels of the evaluation it times: the evaluator
pauses its own other sandboxes, but it cannot pause another process's. Two evaluators on one GPU
(two sweeps sharing it, an evaluation beside a training run's pool) time each other's kernels:
the profiler's kernel time and the timed one then disagree for reasons that are not the
solution's. Each evaluator therefore holds a claim on its GPU, a file locked while it has
evaluations running there, and asks before and after a measurement whether anyone else holds
one. The lock is the kernel's (``flock``): a process that dies releases it, so a stale file is
recognised by being lockable and is removed.

The claims live in a folder only this user can write (``kernelrl-gpu-<euid>-<gpu>`` under
``/dev/shm``, mode 0700), checked on an open descriptor (``O_NOFOLLOW``, ``fstat``: a folder of
ours, not a link, no group or other bits) and used through that descriptor only. A folder of the
same name that fails the checks (planted by another user, a symbolic link) is never used: the
next of a few fixed names is, so every evaluator of this user still finds the others; if none
can be had, no claim is held and every measurement says that sharing is unknown. Inside the
folder only regular files with a claim's name are read (opened non-blocking, without following
links), and only a file proven stale (regular, lockable, still the same file) is removed. A
claim that cannot be made (``/dev/shm`` full) is not an evaluation's failure: the evaluation goes
on without one, and its measurement is marked as shared-unknown (timing unused).

Only this user's evaluators are seen: another user's evaluator on the same GPU is not (its
claims are in its own folder), which docs/threat-model.md lists as not guaranteed.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import secrets
import stat
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

CLAIM_SUFFIX = ".claim"
#: EvalResult.sandbox keys: the pids of other evaluators seen on the GPU during a measurement,
#: and why it could not be known whether there were any. Either makes the timing unused.
SHARED_WITH_KEY = "gpu_shared_with"
SHARING_UNKNOWN_KEY = "gpu_sharing_unknown"
#: Folders tried in order (``name``, ``name.1``, ...) when one of the same name is not ours.
FOLDER_CANDIDATES = 8
_CLAIM_NAME = re.compile(r"([1-9][0-9]{0,9})-[A-Za-z0-9_]{1,64}" + re.escape(CLAIM_SUFFIX))
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def claims_root() -> Path:
    """Shared memory where there is one (cleared at boot, as the claims should be)."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def device_key(device: torch.device) -> str:
    """The GPU's UUID, the same in every process whatever CUDA_VISIBLE_DEVICES maps it to."""
    props = torch.cuda.get_device_properties(device)
    uuid = getattr(props, "uuid", None)
    if uuid is None:  # older torch: the PCI address names the device as well
        uuid = f"pci-{props.pci_domain_id}-{props.pci_bus_id}-{props.pci_device_id}"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(uuid))


def folder_name(key: str, candidate: int = 0) -> str:
    """The name of this user's claims folder for GPU ``key`` (``candidate`` > 0: a fallback)."""
    name = f"kernelrl-gpu-{os.geteuid()}-{key}"
    return name if candidate == 0 else f"{name}.{candidate}"


@dataclass(frozen=True)
class Sharing:
    """What a look at the claims found: other evaluators' pids, or why nobody can tell."""

    pids: tuple[int, ...] = ()
    unknown: str | None = None

    @property
    def alone(self) -> bool:
        """Whether the GPU is known to have been this evaluator's alone."""
        return not self.pids and self.unknown is None

    def merge(self, other: Sharing) -> Sharing:
        return Sharing(tuple(sorted({*self.pids, *other.pids})), self.unknown or other.unknown)

    def record(self) -> dict[str, object]:
        """The EvalResult.sandbox entries that say why a measurement's timing is unused."""
        entries: dict[str, object] = {}
        if self.pids:
            entries[SHARED_WITH_KEY] = list(self.pids)
        if self.unknown is not None:
            entries[SHARING_UNKNOWN_KEY] = self.unknown
        return entries


def _open_private_folder(parent: Path, name: str) -> int:
    """A descriptor of ``parent/name``, made (mode 0700) if missing; OSError, with the reason,
    when what is there is not a folder of this user that only this user may use."""
    try:
        parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise OSError(exc.errno, f"{parent}: {exc.strerror}") from None
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=parent_fd)
        try:
            fd = os.open(name, _OPEN_DIR, dir_fd=parent_fd)
        except OSError as exc:  # ELOOP: a symbolic link; ENOTDIR: a file
            raise OSError(exc.errno, f"{parent / name}: {exc.strerror}") from None
    finally:
        os.close(parent_fd)
    info = os.fstat(fd)
    problem = None
    if info.st_uid != os.geteuid():
        problem = f"owned by uid {info.st_uid}, not {os.geteuid()}"
    elif stat.S_IMODE(info.st_mode) & 0o077:
        problem = f"mode {stat.S_IMODE(info.st_mode):o} lets others in"
    if problem is not None:
        os.close(fd)
        raise OSError(0, f"{parent / name}: {problem}")
    return fd


class GpuClaim:
    """This evaluator's claim on one GPU, held while it has work there (``held``); ``survey()``
    says who else holds one. An idle evaluator holds none: it disturbs no one's timing."""

    def __init__(self, key: str, root: Path | None = None) -> None:
        self.key = key
        self.root = root or claims_root()
        self.folder = self.root / folder_name(key)
        self.path: Path | None = None
        self._dir: int | None = None
        self._refused: str | None = None  # why no folder could be had
        self._failed: str | None = None  # why the claim of the current hold could not be made
        self._fd: int | None = None
        self._holders = 0
        self._lock = threading.Lock()
        with self._lock:
            self._folder()

    @classmethod
    def for_device(cls, device: torch.device) -> GpuClaim:
        return cls(device_key(device))

    def _folder(self) -> int | None:
        """The folder's descriptor, opened on first use (and tried again while none could be);
        the first candidate that passes the checks. Called under ``_lock``."""
        if self._dir is not None:
            return self._dir
        reasons = []
        for candidate in range(FOLDER_CANDIDATES):
            name = folder_name(self.key, candidate)
            try:
                self._dir = _open_private_folder(self.root, name)
            except OSError as exc:
                reasons.append(exc.strerror or str(exc))
                continue
            self.folder, self._refused = self.root / name, None
            if reasons:
                log.warning("GPU claims folder not used (%s); using %s", reasons[0], self.folder)
            return self._dir
        self._refused = f"no private GPU claims folder: {reasons[0]}"
        return None

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """The claim for the length of a block; blocks of several threads share it. Never
        raises for want of a claim: the block runs without one, and ``survey`` says so."""
        with self._lock:
            if self._holders == 0:
                self._take()
            self._holders += 1
        try:
            yield
        finally:
            with self._lock:
                self._holders -= 1
                if self._holders == 0:
                    self._give_back()

    def survey(self) -> Sharing:
        """The other evaluators holding a live claim on this GPU (this process's own when a
        second evaluator of it works there), or why that cannot be known; dead processes'
        claims are removed on the way."""
        with self._lock:
            folder = self._folder()
            unknown = self._refused or self._failed
            own = self.path.name if self.path is not None else None
            if folder is None:
                return Sharing(unknown=unknown)
            try:
                names = os.listdir(folder)
            except OSError as exc:
                return Sharing(unknown=f"GPU claims folder unreadable: {exc.strerror}")
            pids = [pid for name in sorted(names) if name != own and (pid := self._live(name))]
        return Sharing(tuple(sorted(set(pids))), unknown)

    def others(self) -> list[int]:
        """The pids of ``survey``."""
        return list(self.survey().pids)

    def _live(self, name: str) -> int | None:
        """The pid of claim ``name`` when its evaluator holds it; a stale claim is removed.
        Anything but a regular file of ours with a claim's name is ignored, never opened
        blocking (a FIFO), never followed (a link), never removed."""
        match = _CLAIM_NAME.fullmatch(name)
        if match is None or self._dir is None:
            return None
        try:
            before = os.stat(name, dir_fd=self._dir, follow_symlinks=False)
            if not stat.S_ISREG(before.st_mode):
                return None
            flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(name, flags, dir_fd=self._dir)
        except OSError:  # gone meanwhile (its evaluator finished), or not a file
            return None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                return None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return int(match[1])
            # Nobody holds it, and a claim is locked whenever it is visible: its process died.
            # Removed only while it is still the file we locked (never another by that name).
            with contextlib.suppress(OSError):
                now = os.stat(name, dir_fd=self._dir, follow_symlinks=False)
                if (now.st_dev, now.st_ino) == (info.st_dev, info.st_ino):
                    os.unlink(name, dir_fd=self._dir)
            return None
        finally:
            os.close(fd)

    def close(self) -> None:
        with self._lock:
            self._holders = 0
            self._give_back()
            if self._dir is not None:
                os.close(self._dir)
                self._dir = None

    def _take(self) -> None:
        """Make the claim: locked under a hidden name, then renamed, so a claim is never
        visible unlocked (no one takes it for a dead process's and removes it). A failure
        (no folder, no space) leaves no claim and its reason for ``survey``."""
        self._failed = None
        folder = self._folder()
        if folder is None:
            return
        token = secrets.token_hex(8)
        hidden, name = f".{token}{CLAIM_SUFFIX}", f"{os.getpid()}-{token}{CLAIM_SUFFIX}"
        fd = None
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(hidden, flags, 0o600, dir_fd=folder)
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.rename(hidden, name, src_dir_fd=folder, dst_dir_fd=folder)
        except OSError as exc:
            if fd is not None:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(hidden, dir_fd=folder)
            self._failed = f"no GPU claim could be made in {self.folder}: {exc.strerror or exc}"
            log.warning("%s; measurements meanwhile do not use their timing", self._failed)
            return
        self.path, self._fd = self.folder / name, fd

    def _give_back(self) -> None:
        self._failed = None
        if self._fd is None or self.path is None:
            return
        if self._dir is not None:  # removed before the unlock: never seen unlocked
            with contextlib.suppress(OSError):
                os.unlink(self.path.name, dir_fd=self._dir)
        os.close(self._fd)
        self.path, self._fd = None, None
