"""Which kernelrl evaluators on this host use the same GPU.

A measurement trusts that the GPU runs only the kernels of the evaluation it times: the evaluator
pauses its own other sandboxes, but it cannot pause another process's. Two evaluators on one GPU
(two sweeps sharing it, an evaluation beside a training run's pool) time each other's kernels:
the profiler's kernel time and the timed one then disagree for reasons that are not the
solution's. Each evaluator therefore holds a claim on its GPU, a file locked while it has
evaluations running there, and asks before and after a measurement whether anyone else holds
one. The lock is the kernel's (``flock``): a process that dies releases it, so a stale file is
recognised by being lockable and is removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import torch

CLAIM_SUFFIX = ".claim"


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


class GpuClaim:
    """This evaluator's claim on one GPU, held while it has work there (``held``); ``others()``
    says who else holds one. An idle evaluator holds none: it disturbs no one's timing."""

    def __init__(self, key: str, root: Path | None = None) -> None:
        self.folder = (root or claims_root()) / f"kernelrl-gpu-{key}"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path: Path | None = None
        self._fd: int | None = None
        self._holders = 0
        self._lock = threading.Lock()

    @classmethod
    def for_device(cls, device: torch.device) -> GpuClaim:
        return cls(device_key(device))

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """The claim for the length of a block; blocks of several threads share it."""
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

    def others(self) -> list[int]:
        """The processes holding another live claim on this GPU (this one's own when a second
        evaluator of it works there); dead processes' claims are removed on the way."""
        pids = []
        for entry in sorted(self.folder.glob(f"[!.]*{CLAIM_SUFFIX}")):
            if entry == self.path:
                continue
            try:
                fd = os.open(entry, os.O_RDONLY)
            except FileNotFoundError:  # its evaluator finished meanwhile
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pids.append(int(entry.name.split("-", 1)[0]))
            else:  # nobody holds it: its process died holding it
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()
            finally:
                os.close(fd)
        return pids

    def close(self) -> None:
        with self._lock:
            self._holders = 0
            self._give_back()

    def _take(self) -> None:
        # Locked under a hidden name, then renamed: a claim is never visible unlocked, so no
        # one takes it for a dead process's and removes it.
        fd, hidden = tempfile.mkstemp(dir=self.folder, prefix=".", suffix=CLAIM_SUFFIX)
        fcntl.flock(fd, fcntl.LOCK_EX)
        path = self.folder / f"{os.getpid()}-{Path(hidden).stem.lstrip('.')}{CLAIM_SUFFIX}"
        os.rename(hidden, path)
        self.path, self._fd = path, fd

    def _give_back(self) -> None:
        if self._fd is None or self.path is None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # before the unlock: never seen unlocked
        os.close(self._fd)
        self.path, self._fd = None, None
