"""Process isolation of a sandbox child, applied before it imports anything heavy.

``isolate`` is the first thing ``sandbox_child`` runs. What it builds, step by step, keeping
whatever the host permits (each step is reported, none is required):

- **Namespaces**: new network, mount and PID namespaces (as root; otherwise inside a new user
  namespace; otherwise each one alone). ``unshare`` acts on the calling thread only, so this
  must run while the process is single-threaded, before torch starts its threads.
- **PID namespace**: the process that called ``unshare(CLONE_NEWPID)`` cannot enter it; it
  stays outside as a thin *waiter* (the process the worker knows, the leader of the process
  group ``Child.kill`` kills) and forks the namespace's *init* (PID 1), which forks the *job*
  process that returns from ``isolate`` and runs the solution. When the job ends, init exits and
  the kernel kills every process left in the namespace, whatever it did (setsid, double fork,
  ignoring signals). The job is not PID 1 itself because PID 1 ignores signals it has no
  handler for (SIGXCPU, SIGTERM...), which would change how a crash is reported. The waiter
  exits with the job's status (re-raising its signal), so ``Child.describe_exit`` reads the
  same as without namespaces. Init dies with the waiter (``PR_SET_PDEATHSIG``) and the waiter
  with the worker, so a killed worker or waiter takes the whole namespace along.
- **Mount namespace**: every mount read-only and nosuid, a private tmpfs over ``/tmp`` and
  ``/dev/shm`` (other evaluations' scratch directories live there), the scratch directory (the
  cwd) bound back writable, and a fresh ``/proc`` that shows the namespace's processes only.
  Device files stay usable on a read-only mount (writes to a device are not writes to the
  filesystem): /dev/nvidia* keep working; /sys and /proc/driver stay readable.
- **User**: a uid/gid of its own, unused by anyone else (``SANDBOX_UID_BASE`` + the waiter's
  pid), owner of the scratch directory; supplementary groups only those of GPU device files
  that are not open to everyone; ``PR_SET_NO_NEW_PRIVS``. If that user could not read the
  interpreter, torch, triton or kernelrl (or open the GPU), the child stays root and says so.

``Child.pause`` stops the waiter's process group with SIGSTOP. A process that calls ``setsid``
leaves that group and is not stopped, but it stays in the namespaces, as the sandbox's user,
and dies with the evaluation.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import importlib.util
import os
import re
import resource
import select
import signal
import stat
import sys
from dataclasses import dataclass, field

CLONE_NEWNS = 0x00020000
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

_CAPABILITY_VERSION_3 = 0x20080522

# Far above the ranges distributions, systemd and subuid allocations hand out.
SANDBOX_UID_BASE = 0x40000000
PRIVATE_TMPFS_BYTES = 64 * 2**20
PRIVATE_TMPFS = ("/tmp", "/dev/shm")

_NAMESPACES = ((CLONE_NEWNET, "network"), (CLONE_NEWNS, "mount"), (CLONE_NEWPID, "pid"))


@dataclass
class Isolation:
    """What ``isolate`` achieved, one phrase per aspect."""

    network: str = "not isolated"  # "netns", "userns+netns" or why not: the old NETWORK values
    namespaces: list[str] = field(default_factory=list)
    processes: str = "not isolated"
    filesystem: str = "not isolated"
    user: str = "unchanged"

    def describe(self) -> str:
        names = "+".join(self.namespaces) or "none"
        return (
            f"namespaces: {names}; processes: {self.processes}; "
            f"filesystem: {self.filesystem}; user: {self.user}"
        )


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_void_p]
    libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    return libc


def _errno_text(prefix: str) -> str:
    code = ctypes.get_errno()
    return f"{prefix} ({os.strerror(code)})"


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    libc = _libc()
    encode = lambda s: s.encode() if s is not None else None  # noqa: E731
    if libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data or None)):
        code = ctypes.get_errno()
        raise OSError(code, f"mount {target}: {os.strerror(code)}")


def _prctl(option: int, value: int) -> None:
    if _libc().prctl(option, value, 0, 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"prctl({option}) failed")


# --------------------------------------------------------------------------- namespaces


def _unshare(report: Isolation) -> tuple[int, bool]:
    """Namespaces made, all at once if possible; returns (flags obtained, via a user ns)."""
    libc = _libc()
    wanted = CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID
    if libc.unshare(wanted) == 0:
        return wanted, False
    report.network = _errno_text("unavailable")
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(CLONE_NEWUSER | wanted) == 0:
        _map_ids(uid, gid)
        return wanted, True
    obtained = 0
    for flag, _ in _NAMESPACES:
        if libc.unshare(flag) == 0:
            obtained |= flag
    return obtained, False


def _map_ids(uid: int, gid: int) -> None:
    """Inside a new user namespace: keep our own uid and gid, the only ones we may map."""
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL from the kernel when the thread that spawned this child ends (the sandbox's
    spawner thread lives as long as the worker process): a worker that dies, however it dies,
    takes its children along, running or paused, and never before it has itself stopped
    answering, so no verdict comes from a child killed by its worker's death.

    Set after any change of credentials (unshare of a user namespace, setuid, capset): the
    kernel clears the death signal on such changes."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the worker died before the line above
        os._exit(1)


def _mirror_exit(status: int) -> None:
    """End this process the way the one whose wait status is ``status`` ended."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        _prctl(PR_SET_DUMPABLE, 0)  # no core dump of the waiter, whatever core_pattern says
        try:
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        except (OSError, ValueError):  # SIGKILL/SIGSTOP cannot be changed: nor need they be
            pass
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def _release_channel() -> None:
    """Let go of the protocol socket (standard input, or an fd number in argv[1]): only the
    job talks to the worker, and the worker sees end-of-file as soon as the job is gone."""
    channel = sys.argv[1] if len(sys.argv) > 1 else ""
    if channel.isdigit() and int(channel) > 2:
        os.close(int(channel))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)


def _close_fds_except(*keep: int) -> None:
    """Drop every inherited descriptor but stdio and ``keep``."""
    last = 3
    for fd in sorted(k for k in keep if k >= 3):
        os.closerange(last, fd)
        last = fd + 1
    os.closerange(last, os.sysconf("SC_OPEN_MAX"))


def _waiter(init_pid: int, alive_w: int, status_r: int) -> None:
    """The original process, outside the PID namespace: waits for init, then ends as the job
    ended. Holds ``alive_w`` open so that init can tell whether the waiter still lives."""
    _release_channel()
    _close_fds_except(alive_w, status_r)
    while True:
        try:
            _, status = os.waitpid(init_pid, 0)
            break
        except ChildProcessError:
            os._exit(1)
    reported = os.read(status_r, 64)
    _mirror_exit(int(reported) if reported.strip() else status)


def _init(job_pid: int, status_w: int) -> None:
    """PID 1 of the namespace: reaps orphans until the job ends, hands the job's wait status to
    the waiter and exits, which makes the kernel kill everything left in the namespace."""
    _release_channel()
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(1)
        if pid == job_pid:
            os.write(status_w, str(status).encode())
            os._exit(0)


# --------------------------------------------------------------------------- filesystem


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


def _flags_of(path: str) -> int:
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
            _mount("tmpfs", ancestor, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
            for entry, fd in handles.items():
                target = os.path.join(ancestor, entry)
                if stat.S_ISDIR(os.fstat(fd).st_mode):
                    os.mkdir(target)
                else:
                    open(target, "w").close()
                _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
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
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        for point, fd in handles:
            with contextlib.suppress(OSError):
                _mount(f"/proc/self/fd/{fd}", point, None, MS_BIND)
                flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | _flags_of(point)
                _mount(None, point, None, flags)
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
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | _flags_of(path))


def _confine_filesystem(scratch: str, own_proc: bool, needed: list[str]) -> str:
    """Read-only everything, private /tmp and /dev/shm, scratch writable, own /proc; the
    ``needed`` paths reachable for a user who is not root."""
    scratch_fd = os.open(scratch, os.O_PATH | os.O_DIRECTORY)
    try:
        _mount(None, "/", None, MS_REC | MS_PRIVATE)
        covered = _expose_needed(needed)
        left_writable = []
        for point, fstype in _mount_points():
            if fstype == "autofs" or point.startswith("/proc/"):  # never trigger an automount
                continue
            try:
                flags = _flags_of(point)
                _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | flags)
            except OSError:
                if os.path.exists(point):
                    left_writable.append(point)
        private = []
        for point in PRIVATE_TMPFS:
            if os.path.isdir(point) and not os.path.islink(point):
                kept = _open_code_under(point, needed)
                options = f"size={PRIVATE_TMPFS_BYTES},mode=1777"
                try:
                    _mount("tmpfs", point, "tmpfs", MS_NOSUID | MS_NODEV, options)
                    _bind_back_read_only(kept)
                finally:
                    for fd in kept.values():
                        os.close(fd)
                private.append(point)
        if not os.path.isdir(scratch):
            os.makedirs(scratch)
        _mount(f"/proc/self/fd/{scratch_fd}", scratch, None, MS_BIND)
        keep = _flags_of(scratch) & ~MS_RDONLY
        _mount(None, scratch, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | keep)
        os.chdir(scratch)  # the old cwd is the read-only mount underneath
    finally:
        os.close(scratch_fd)
    proc = "host /proc (read-only)"
    if own_proc:
        try:
            _mount_own_proc()
            proc = "own /proc"
        except OSError as exc:
            proc = f"host /proc (read-only; own /proc failed: {exc.strerror})"
    text = "read-only except the scratch dir"
    if left_writable:
        text += f" (left writable: {', '.join(left_writable[:5])})"
    text += f"; private tmpfs on {', '.join(private) or 'nothing'}; {proc}"
    if covered:
        text += f"; only what the child needs left in {', '.join(covered)}"
    return text


# --------------------------------------------------------------------------- user


def _needed_paths(device: str) -> list[tuple[str, int]]:
    """What the sandbox's user must be able to use for the child to work at all, with how."""
    code = os.R_OK | os.X_OK
    paths = [(sys.executable, code), (os.path.dirname(os.__file__), code)]
    for name in ("torch", "triton", "kernelrl"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            paths.extend((p, code) for p in spec.submodule_search_locations)
    # Everything importable: carried packages (e.g. /tmp/site on a GPU host) and the checkout.
    paths.extend((p, code) for p in sys.path if p and os.path.isdir(p))
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

    if _libc().capset(ctypes.byref(Header(_CAPABILITY_VERSION_3, 0)), (Data * 2)()) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def _become_sandbox_user(scratch: str, uid: int, device: str) -> str:
    """As root: switch to ``uid``, owner of the scratch dir, if it can still run the child."""
    groups = _gpu_groups()
    old_groups = os.getgroups()
    os.chown(scratch, uid, uid)
    os.setgroups(groups)
    os.setresgid(uid, uid, uid)
    os.setresuid(-1, uid, -1)  # effective only: reversible while the saved uid is 0
    unreadable = [
        p for p, mode in _needed_paths(device) if not os.access(p, mode, effective_ids=True)
    ]
    if unreadable:
        os.setresuid(-1, 0, -1)
        os.setresgid(0, 0, 0)
        os.setgroups(old_groups)
        os.chown(scratch, 0, 0)
        return f"root (uid {uid} could not read {unreadable[0]})"
    os.setresuid(uid, uid, uid)  # all uids non-zero: every capability is gone
    os.environ.setdefault("USER", "kernelrl-sandbox")  # no passwd entry: getpass needs these
    os.environ.setdefault("LOGNAME", "kernelrl-sandbox")
    extra = f", groups {groups}" if groups else ""
    return f"uid {uid} gid {uid}{extra}, no capabilities"


def _drop_privileges(scratch: str, uid: int, in_user_ns: bool, device: str) -> str:
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
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        text += ", no_new_privs"
    except OSError:
        pass
    return text


# --------------------------------------------------------------------------- entry point


def isolate(parent_pid: int) -> Isolation:
    """Isolate this sandbox child as far as the host permits; returns (in the process that
    goes on to run the solution) what was achieved. Call while single-threaded, with the
    scratch directory as cwd."""
    report = Isolation()
    scratch = os.getcwd()
    device = os.environ.get("KERNELRL_DEVICE", "cpu")
    uid = SANDBOX_UID_BASE + os.getpid()
    flags, in_user_ns = _unshare(report)
    report.namespaces = [name for flag, name in _NAMESPACES if flags & flag]
    if flags & CLONE_NEWNET:
        report.network = "userns+netns" if in_user_ns else "netns"
    if in_user_ns:
        report.namespaces.insert(0, "user")

    in_pid_ns = bool(flags & CLONE_NEWPID)
    if in_pid_ns:
        die_with_parent(parent_pid)  # the waiter dies with the worker
        alive_r, alive_w = os.pipe()
        status_r, status_w = os.pipe()
        init_pid = os.fork()
        if init_pid:
            os.close(alive_r)
            os.close(status_w)
            _waiter(init_pid, alive_w, status_r)  # never returns
        os.close(alive_w)
        os.close(status_r)

    if flags & CLONE_NEWNS:
        try:
            needed = [] if in_user_ns else [p for p, _ in _needed_paths(device)]
            report.filesystem = _confine_filesystem(scratch, in_pid_ns, needed)
        except OSError as exc:
            report.filesystem = f"partly confined ({exc})"
    report.user = _drop_privileges(scratch, uid, in_user_ns, device)

    if not in_pid_ns:
        report.processes = "no pid namespace: a process that calls setsid can outlive the job"
        die_with_parent(parent_pid)
        return report

    # init: dies with the waiter (set after the change of credentials, which clears it)
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    _prctl(PR_SET_DUMPABLE, 0)  # the job, same uid, may not ptrace it
    waiter_gone, _, _ = select.select([alive_r], [], [], 0)
    if waiter_gone:  # EOF: the waiter died before the death signal was set
        os._exit(1)
    job_pid = os.fork()
    if job_pid:
        _init(job_pid, status_w)  # never returns
    os.close(alive_r)
    os.close(status_w)
    _prctl(PR_SET_DUMPABLE, 1)  # its own /proc/self/fd etc. stay its own (fork copied init's 0)
    report.processes = "own pid namespace: everything the job starts dies with it"
    return report
