"""The sandbox child's filesystem: a root of its own that holds only what the child needs.

A read-only view of the host stops writes but not ``connect(2)``: a Unix socket file anywhere the
child can see (``/var/tmp``, ``/run``, a home directory, ``docker.sock``; the network namespace
does not cover socket files, they live in the filesystem) can be connected to through a
read-only mount. So the child does not see the host's tree at all. In its mount namespace
(``isolation``) ``confine_filesystem`` mounts an empty tmpfs, binds into it, read-only, only

- the system trees every program needs (``SYSTEM_TREES``: ``/usr``, ``/etc``, the ``/lib*``,
  ``/bin``, ``/sbin``; as links where the host has links);
- the interpreter (its prefix: headers, standard library), every directory on the child's
  ``sys.path``, ``PATH`` and ``LD_LIBRARY_PATH``, ``CUDA_HOME``/``CUDA_PATH``, the directories
  of the shared libraries it has loaded; of kernelrl's own package only the environment's code
  (``env/`` and what it imports, named by the worker in ``KERNELRL_VIEW_PACKAGE``), not the
  checkout around it;
- in ``/dev`` the null, zero, full, random and urandom devices, and on a GPU the NVIDIA ones;
- ``/sys`` (read-only) and its own ``/proc``;

mounts fresh private tmpfs on ``/tmp`` and ``/dev/shm``, binds the scratch directory back
writable, makes the new root itself read-only, pivots into it and detaches the host's root: no
path leads back. Symbolic links on the way to a bound path are made again as they are, so every
path the child was given names the same file inside. Where the host refuses any of it, the
read-only host view of ``isolation_mounts`` is used instead, and the report says so.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import json
import os
import platform
import stat
import sys
import sysconfig

from kernelrl.env.sandbox.isolation_mounts import (
    PRIVATE_TMPFS,
    PRIVATE_TMPFS_BYTES,
    confine_host_view,
    flags_of,
    proc_submounts,
    read_only_everywhere,
)
from kernelrl.env.sandbox.linux import (
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_RDONLY,
    MS_REC,
    MS_REMOUNT,
    load_libc,
    mount,
)

SYSTEM_TREES = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
#: Set by the worker: ``{"root": kernelrl's package folder, "entries": what the child needs}``.
VIEW_PACKAGE_ENV = "KERNELRL_VIEW_PACKAGE"
VIEW_ROOT_BYTES = 4 * 2**20  # folders and links only
_OWN = ("/", "/tmp", "/dev", "/dev/shm", "/proc", "/sys")  # made by the view itself
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217, "riscv64": 41}
_MNT_DETACH = 2


def package_view() -> str:
    """``VIEW_PACKAGE_ENV``'s value: kernelrl's package folder and its entries the child
    imports (``env/`` and what it imports from kernelrl). Computed by the worker, once."""
    from kernelrl.env.verdict_key import environment_files, package_root

    root = package_root()
    entries = sorted({path.relative_to(root).parts[0] for path in environment_files(root)})
    return json.dumps({"root": str(root), "entries": entries})


def _package() -> tuple[str, list[str]] | None:
    """The package folder and the entries of it the child may see; None: the whole folder."""
    given = os.environ.get(VIEW_PACKAGE_ENV)
    if not given:
        return None
    try:
        data = json.loads(given)
        return os.path.realpath(str(data["root"])), [str(e) for e in data["entries"]]
    except (ValueError, KeyError, TypeError):
        return None


def view_sources(needed: list[str]) -> list[str]:
    """What the child's view is built from, besides the system trees: ``needed`` (what the
    sandbox user must read) and what programs the child runs look for."""
    paths = list(needed)
    paths += [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    paths += [sysconfig.get_paths().get(name, "") for name in ("include", "platinclude")]
    for variable in ("PATH", "LD_LIBRARY_PATH"):
        paths += os.environ.get(variable, "").split(os.pathsep)
    for variable in ("CUDA_HOME", "CUDA_PATH", "TRITON_PTXAS_PATH"):
        paths.append(os.environ.get(variable, ""))
    paths.append("/usr/local/cuda")  # where torch looks for CUDA without CUDA_HOME
    with contextlib.suppress(OSError), open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            mapped = fields[5].strip() if len(fields) == 6 else ""
            if mapped.startswith("/") and ".so" in os.path.basename(mapped):
                paths.append(os.path.dirname(mapped))
    return [p for p in paths if os.path.isabs(p)]


class ViewPlan:
    """The paths to bind into the view (real paths, none under another) and the symbolic links
    on the way to them, decided before anything is mounted."""

    def __init__(self, package: tuple[str, list[str]] | None) -> None:
        self.package = package
        self.binds: set[str] = set()
        self.links: dict[str, str] = {}

    def add(self, path: str, hops: int = 0) -> None:
        """``path`` as the child will name it: each symbolic link on the way is kept as a link
        and its target added in turn; the real path at the end is bound."""
        parts = [part for part in os.path.normpath(path).split("/") if part]
        current = "/"
        for index, part in enumerate(parts):
            candidate = os.path.join(current, part)
            try:
                info = os.lstat(candidate)
            except OSError:
                return
            if stat.S_ISLNK(info.st_mode):
                if hops >= 40:  # a loop of links
                    return
                target = os.readlink(candidate)
                self.links[candidate] = target
                self.add(os.path.join(current, target, *parts[index + 1 :]), hops + 1)
                return
            current = candidate
        if current not in _OWN and not _made_by_view(current):
            self.binds.add(current)

    def sources(self) -> list[str]:
        """The bound paths: kernelrl's package folder and the folders above it are replaced by
        their other entries and the package's allowed ones; a path under another is dropped."""
        expanded: set[str] = set()
        for path in self.binds:
            if self.package is not None and _covers(path, self.package[0]):
                expanded |= self._around(path)
            else:
                expanded.add(path)
        kept: list[str] = []
        for path in sorted(expanded):  # a folder sorts before what is in it
            if not any(_covers(outer, path) for outer in kept):
                kept.append(path)
        return kept

    def _around(self, folder: str) -> set[str]:
        """``folder``'s entries, without the one leading to the package but its allowed ones."""
        assert self.package is not None
        root, entries = self.package
        if folder == root:
            names = [e for e in entries if os.path.lexists(os.path.join(root, e))]
        else:
            names = os.listdir(folder)
        found: set[str] = set()
        for name in names:
            path = os.path.join(folder, name)
            if folder != root and _covers(path, root):
                found |= self._around(path)
                continue
            try:
                kind = os.lstat(path).st_mode
            except OSError:
                continue
            if stat.S_ISLNK(kind):
                self.links[path] = os.readlink(path)
            elif stat.S_ISDIR(kind) or stat.S_ISREG(kind):  # never a socket, a FIFO, a device
                found.add(path)
        return found


def _covers(outer: str, path: str) -> bool:
    return path == outer or path.startswith(outer.rstrip("/") + "/")


def _made_by_view(path: str) -> bool:
    """Paths the view makes itself (devices, /proc, /sys), never bound from ``needed``."""
    if path.startswith("/dev/shm/"):
        return False
    return any(path.startswith(top + "/") for top in ("/dev", "/proc", "/sys"))


def _bind(fd: int, target: str) -> None:
    """Bind what ``fd`` names onto ``target`` (made, as a folder or a file, if missing),
    read-only and nosuid; the mounts under it come along as they are (read-only already)."""
    if not os.path.lexists(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            os.mkdir(target)
        else:
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
    mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
    mount(None, target, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_RDONLY | flags_of(target))


def _open_all(paths: list[str]) -> dict[str, int]:
    """Descriptors of what will be bound, taken before anything covers it; a path that is
    missing, or is a link (never followed), is left out."""
    handles: dict[str, int] = {}
    try:
        for path in paths:
            with contextlib.suppress(OSError):
                fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
                if stat.S_ISLNK(os.fstat(fd).st_mode):
                    os.close(fd)
                    continue
                handles[path] = fd
    except BaseException:
        for fd in handles.values():
            os.close(fd)
        raise
    return handles


def _devices(device: str) -> list[str]:
    found = [p for p in DEVICES if os.path.exists(p)]
    if device != "cpu":
        found += sorted(glob.glob("/dev/nvidia*"))
    return found


def _populate(
    root: str, plan: ViewPlan, sources: list[str], handles: dict[str, int], own_proc: bool
) -> str:
    """Fill the new root (mounted at ``root``); returns what became of /proc."""
    for point in PRIVATE_TMPFS:
        os.makedirs(root + point, exist_ok=True)
        options = f"size={PRIVATE_TMPFS_BYTES},mode=1777"
        mount("tmpfs", root + point, "tmpfs", MS_NOSUID | MS_NODEV, options)
    for path, fd in handles.items():
        if path in sources or path.startswith("/dev/"):
            _bind(fd, root + path)
    for link, target in sorted(plan.links.items()):
        if any(_covers(source, link) for source in sources) or os.path.lexists(root + link):
            continue
        os.makedirs(os.path.dirname(root + link), exist_ok=True)
        os.symlink(target, root + link)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0")):
        os.symlink(target, f"{root}/dev/{name}")
    for number, name in ((1, "stdout"), (2, "stderr")):
        os.symlink(f"/proc/self/fd/{number}", f"{root}/dev/{name}")
    if "/sys" in handles:
        _bind(handles["/sys"], root + "/sys")
    os.makedirs(root + "/proc", exist_ok=True)
    if own_proc:
        try:
            mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        except OSError as exc:
            proc = f"host /proc (read-only; own /proc failed: {exc.strerror})"
        else:
            for point, fd in handles.items():  # the host's masks inside /proc stay
                if point.startswith("/proc/"):
                    with contextlib.suppress(OSError):
                        _bind(fd, root + point)
            return "own /proc"
    else:
        proc = "host /proc (read-only)"
    _bind(handles["/proc"], root + "/proc")
    return proc


def _pivot_into(root: str) -> None:
    """Make ``root`` this mount namespace's root and detach the host's: nothing of it stays
    reachable from here."""
    number = _PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise OSError(0, f"pivot_root: unknown on {platform.machine()}")
    libc = load_libc()
    os.chdir(root)
    if libc.syscall(number, b".", b".") != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"pivot_root: {os.strerror(code)}")
    if libc.umount2(b".", _MNT_DETACH) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"detaching the host's root: {os.strerror(code)}")
    os.chdir("/")


def build_view(
    scratch: str, scratch_fd: int, own_proc: bool, needed: list[str], device: str
) -> tuple[str, list[str]]:
    """The allow-list view (see the module's docstring), pivoted into; the scratch directory
    ``scratch`` (held open as ``scratch_fd``) stays where it was, writable. Returns what became
    of /proc and the host paths bound into the view. Before the pivot, any failure takes back
    what was mounted and raises OSError."""
    plan = ViewPlan(_package())
    for path in (*SYSTEM_TREES, *view_sources(needed)):
        plan.add(path)
    sources = plan.sources()
    handles = _open_all([*sources, *_devices(device), "/sys", "/proc", *proc_submounts()])
    root = scratch  # the new root covers the scratch folder; the folder itself is bound back
    try:
        mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, f"size={VIEW_ROOT_BYTES},mode=755")
        try:
            proc = _populate(root, plan, sources, handles, own_proc)
            os.makedirs(root + scratch, exist_ok=True)
            # Not recursive: the new root itself is mounted on the scratch folder.
            mount(f"/proc/self/fd/{scratch_fd}", root + scratch, None, MS_BIND)
            keep = flags_of(root + scratch) & ~MS_RDONLY
            mount(None, root + scratch, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | keep)
            mount(None, root, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        except BaseException:
            load_libc().umount2(root.encode(), _MNT_DETACH)
            raise
    finally:
        for fd in handles.values():
            os.close(fd)
    _pivot_into(root)
    os.chdir(scratch)
    return proc, [*sources, "/sys", "/proc"]


def confine_filesystem(scratch: str, own_proc: bool, needed: list[str], device: str) -> str:
    """The child's filesystem: the allow-list view where the host permits it, else the
    read-only host view (``isolation_mounts``). Returns what was achieved, for the report."""
    scratch_fd = os.open(scratch, os.O_PATH | os.O_DIRECTORY)
    try:
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        left_writable = read_only_everywhere()
        try:
            proc, bound = build_view(scratch, scratch_fd, own_proc, needed, device)
        except OSError as exc:
            text = confine_host_view(scratch, scratch_fd, own_proc, needed)
            return f"{text}; no own root ({exc}): host socket files reachable"
    finally:
        os.close(scratch_fd)
    text = "read-only except the scratch dir"
    exposed = [p for p in left_writable if any(_covers(b, p) for b in bound)]
    if exposed:  # host mounts that refused read-only, inside a bound tree
        text += f" (left writable: {', '.join(exposed[:5])})"
    return (
        f"{text}; own root: only system trees, interpreter, packages and kernelrl.env, "
        f"host root detached; private tmpfs on {', '.join(PRIVATE_TMPFS)}; {proc}"
    )
