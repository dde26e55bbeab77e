"""The Linux calls the sandbox's isolation needs and Python does not wrap: mount(2) and
prctl(2) through libc, and their flags; and whether a process of ours exists (/proc)."""

from __future__ import annotations

import ctypes
import os

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_NOATIME = 0x400
MS_NODIRATIME = 0x800
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MS_RELATIME = 0x200000
MS_STRICTATIME = 0x1000000

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38


def load_libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_void_p]
    libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    return libc


def errno_text(prefix: str) -> str:
    code = ctypes.get_errno()
    return f"{prefix} ({os.strerror(code)})"


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    libc = load_libc()
    encode = lambda s: s.encode() if s is not None else None  # noqa: E731
    if libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data or None)):
        code = ctypes.get_errno()
        raise OSError(code, f"mount {target}: {os.strerror(code)}")


def prctl(option: int, value: int) -> None:
    if load_libc().prctl(option, value, 0, 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"prctl({option}) failed")


def process_exists(pid: int) -> bool:
    """Whether ``pid`` names a process of this PID namespace (a zombie counts)."""
    return os.path.exists(f"/proc/{pid}")
