"""The child's user (``isolation``): a uid/gid of its own, no capabilities, ``no_new_privs``,
unless that user could not use what the child needs (then it says so and stays as it was)."""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import stat
import sys

from kernelrl.env.sandbox.linux import PR_SET_NO_NEW_PRIVS, load_libc, prctl

_CAPABILITY_VERSION_3 = 0x20080522
# Far above the ranges distributions, systemd and subuid allocations hand out; a child's uid is
# the base plus its waiter's pid, so the range is as wide as the kernel's largest pid.
SANDBOX_UID_BASE = 0x40000000
SANDBOX_UIDS = range(SANDBOX_UID_BASE, SANDBOX_UID_BASE + 2**22)


def is_package_folder(path: str) -> bool:
    """Whether a folder on ``sys.path`` holds installed packages (the interpreter's own, or
    any with ``*.dist-info``/``*.egg-info``: site-packages, a ``pip install --target`` folder
    on ``PYTHONPATH``), rather than being on the path for another reason (a script's folder, a
    test suite's, a home): only those are the child's to see."""
    real = os.path.realpath(path)
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    if any(real.startswith(os.path.realpath(p).rstrip("/") + "/") for p in prefixes):
        return True
    try:
        names = os.listdir(real)
    except OSError:
        return False
    return any(name.endswith((".dist-info", ".egg-info")) for name in names)


def needed_paths(device: str) -> list[tuple[str, int]]:
    """What the sandbox's user must be able to use for the child to work at all, with how:
    the interpreter, torch, Triton and kernelrl, and the package folders on ``sys.path``."""
    code = os.R_OK | os.X_OK
    paths = [(sys.executable, code), (os.path.dirname(os.__file__), code)]
    for name in ("torch", "triton", "kernelrl"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            paths.extend((p, code) for p in spec.submodule_search_locations)
    paths.extend((p, code) for p in sys.path if p and os.path.isdir(p) and is_package_folder(p))
    if device != "cpu":
        devices = [p for p in glob.glob("/dev/nvidia*") if _is_char_device(p)]
        paths.extend((p, os.R_OK | os.W_OK) for p in devices)
    return paths


def _is_char_device(path: str) -> bool:
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return False


def _gpu_groups() -> list[int]:
    """Groups of GPU device files that not everyone may open (they are normally mode 666)."""
    groups = set()
    for path in glob.glob("/dev/nvidia*") + glob.glob("/dev/nvidia-caps/*"):
        try:
            info = os.stat(path)
        except OSError:
            continue
        if stat.S_ISCHR(info.st_mode) and info.st_mode & 0o006 != 0o006:
            groups.add(info.st_gid)
    return sorted(groups)


def _drop_capabilities() -> None:
    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [(n, ctypes.c_uint32) for n in ("effective", "permitted", "inheritable")]

    if load_libc().capset(ctypes.byref(Header(_CAPABILITY_VERSION_3, 0)), (Data * 2)()) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def _chown_tree(scratch: str, uid: int) -> None:
    """The scratch directory and what the worker put in it (the Triton cache seed): the
    child's own to write."""
    os.chown(scratch, uid, uid)
    for folder, dirs, files in os.walk(scratch):
        for name in dirs + files:
            os.chown(os.path.join(folder, name), uid, uid, follow_symlinks=False)


def _become_sandbox_user(scratch: str, uid: int, device: str) -> str:
    """As root: switch to ``uid``, owner of the scratch dir, if it can still run the child."""
    groups = _gpu_groups()
    old_groups = os.getgroups()
    _chown_tree(scratch, uid)
    os.setgroups(groups)
    os.setresgid(uid, uid, uid)
    os.setresuid(-1, uid, -1)  # effective only: reversible while the saved uid is 0
    unreadable = [
        p for p, mode in needed_paths(device) if not os.access(p, mode, effective_ids=True)
    ]
    if unreadable:
        os.setresuid(-1, 0, -1)
        os.setresgid(0, 0, 0)
        os.setgroups(old_groups)
        _chown_tree(scratch, 0)
        return f"root (uid {uid} could not read {unreadable[0]})"
    os.setresuid(uid, uid, uid)  # all uids non-zero: every capability is gone
    os.environ.setdefault("USER", "kernelrl-sandbox")  # no passwd entry: getpass needs these
    os.environ.setdefault("LOGNAME", "kernelrl-sandbox")
    extra = f", groups {groups}" if groups else ""
    return f"uid {uid} gid {uid}{extra}, no capabilities"


def drop_privileges(scratch: str, uid: int, in_user_ns: bool, device: str) -> str:
    try:
        if in_user_ns:
            _drop_capabilities()
            text = f"uid {os.geteuid()} in a user namespace, no capabilities"
        elif os.geteuid() == 0:
            text = _become_sandbox_user(scratch, uid, device)
        else:
            text = f"uid {os.geteuid()} (the worker's own)"
    except OSError as exc:
        text = f"{'root' if os.geteuid() == 0 else f'uid {os.geteuid()}'} (drop failed: {exc})"
    try:
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        text += ", no_new_privs"
    except OSError:
        pass
    return text
