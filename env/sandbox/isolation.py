"""Process isolation of a sandbox child, applied before it imports anything heavy.

``isolate`` is the first thing the sandbox child (``child``) runs. What it builds, step by step, keeping
whatever the host permits (each step is reported in ``Isolation.describe``, none is required):

- **Cgroup**: the child first joins the cgroup v2 its worker made for it (``cgroups``), before
  it forks anything, so every process of the evaluation is inside, whatever it later does to
  its session or process group. The worker freezes that cgroup to pause the evaluation while
  another one is timed (``Child.pause``) and kills it as one (``cgroup.kill``).
- **Namespaces**: new network, mount, PID, IPC and UTS namespaces (as root; otherwise inside a
  new user namespace; otherwise each one alone). ``unshare`` acts on the calling thread only,
  so this must run while the process is single-threaded, before torch starts its threads.
- **IPC namespace**: SysV shared memory, semaphores and message queues, and POSIX message
  queues, made by the solution are its own: no other evaluation can find them, and the kernel
  destroys them with the namespace when the evaluation's last process ends (a SysV segment
  never removed would otherwise stay resident on the host until reboot).
- **UTS namespace**: the hostname is ``SANDBOX_HOSTNAME``, not the host's (often the machine's
  or the pod's name), and nothing inside can rename the host.
- **PID namespace**: the process that called ``unshare(CLONE_NEWPID)`` cannot enter it; it
  stays outside as a thin *waiter* (the process the worker knows, the leader of the process
  group ``Child.kill`` kills) and forks the namespace's *init* (PID 1), which forks the *job*
  process that returns from ``isolate`` and runs the solution. When the job ends, init exits and
  the kernel kills every process left in the namespace, whatever it did (setsid, double fork,
  ignoring signals). The job is not PID 1 itself because PID 1 ignores signals it has no
  handler for (SIGXCPU, SIGTERM...), which would change how a crash is reported. The waiter
  exits with the job's status (re-raising its signal), so ``Child.describe_exit`` reads the
  same as without namespaces. Init dies with the waiter (``PR_SET_PDEATHSIG``) and the waiter
  with the worker, so a killed worker or waiter takes the whole namespace along. Init also
  inherits every orphan of the namespace, so the waiter's process tree is the whole
  evaluation: where no cgroup can be had, the worker pauses and kills that tree by signals.
- **Mount namespace**: a root of the child's own (``isolation_view``) that holds only what it
  needs, read-only and nosuid: the system trees, the interpreter and its packages, kernelrl's
  environment code, a few devices (/dev/nvidia* on a GPU), /sys; a private tmpfs over ``/tmp``
  and ``/dev/shm`` (other evaluations' scratch directories live there), the scratch directory
  (the cwd) bound back writable, and a fresh ``/proc`` that shows the namespace's processes
  only. The host's root is detached, so no socket file or writable folder of the host (in
  ``/var/tmp``, ``/run``, a home) is reachable, read-only or not. Device files stay usable on a
  read-only mount (writes to a device are not writes to the filesystem). The cgroup filesystem
  is read-only too: no process can leave its cgroup or thaw it. Where the host refuses the own
  root, the host's tree is shown read-only instead (``isolation_mounts``), and the report says
  that its socket files are reachable.
- **User**: a uid/gid of its own, unused by anyone else (``SANDBOX_UID_BASE`` + the waiter's
  pid), owner of the scratch directory; supplementary groups only those of GPU device files
  that are not open to everyone; ``PR_SET_NO_NEW_PRIVS``. If that user could not read the
  interpreter, torch, triton or kernelrl (or open the GPU), the child stays root and says so.
"""

from __future__ import annotations

import os
import resource
import select
import signal
import socket
import sys
from dataclasses import dataclass, field

from kernelrl.env.sandbox import cgroups
from kernelrl.env.sandbox.isolation_user import SANDBOX_UID_BASE, drop_privileges, needed_paths
from kernelrl.env.sandbox.isolation_view import confine_filesystem
from kernelrl.env.sandbox.linux import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    CLONE_NEWUTS,
    PR_SET_DUMPABLE,
    PR_SET_PDEATHSIG,
    errno_text,
    load_libc,
    prctl,
)

# The host's name (often the machine's or the pod's) is not the solution's business.
SANDBOX_HOSTNAME = "kernelrl-sandbox"

_NAMESPACES = (
    (CLONE_NEWNET, "network"),
    (CLONE_NEWNS, "mount"),
    (CLONE_NEWPID, "pid"),
    (CLONE_NEWIPC, "ipc"),
    (CLONE_NEWUTS, "uts"),
)
_WANTED = CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS


@dataclass
class Isolation:
    """What ``isolate`` achieved, one phrase per aspect."""

    network: str = "not isolated"  # "netns", "userns+netns" or why not: the old NETWORK values
    namespaces: list[str] = field(default_factory=list)
    processes: str = "not isolated"
    cgroup: str = "no cgroup"  # cgroups.join: how pause and kill reach every process
    ipc: str = "the host's"
    hostname: str = "the host's"
    filesystem: str = "not isolated"
    user: str = "unchanged"

    def describe(self) -> str:
        names = "+".join(self.namespaces) or "none"
        return (
            f"namespaces: {names}; processes: {self.processes}; {self.cgroup}; "
            f"ipc: {self.ipc}; hostname: {self.hostname}; "
            f"filesystem: {self.filesystem}; user: {self.user}"
        )


def _unshare(report: Isolation) -> tuple[int, bool]:
    """Namespaces made, all at once if possible; returns (flags obtained, via a user ns)."""
    libc = load_libc()
    wanted = _WANTED
    if libc.unshare(wanted) == 0:
        return wanted, False
    report.network = errno_text("unavailable")
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(CLONE_NEWUSER | wanted) == 0:
        _map_ids(uid, gid)
        return wanted, True
    obtained = 0
    for flag, _ in _NAMESPACES:
        if libc.unshare(flag) == 0:
            obtained |= flag
    return obtained, False


def _report_ipc_and_uts(report: Isolation, flags: int) -> None:
    """Name the sandbox's host (while it may still: before privileges are dropped) and say
    what the IPC and UTS namespaces achieved."""
    if flags & CLONE_NEWIPC:
        report.ipc = "own namespace (SysV IPC and POSIX queues die with the evaluation)"
    else:
        report.ipc = "the host's (SysV IPC objects can outlive the evaluation)"
    if not flags & CLONE_NEWUTS:
        report.hostname = "the host's (no uts namespace)"
        return
    try:
        socket.sethostname(SANDBOX_HOSTNAME)
        report.hostname = f"{SANDBOX_HOSTNAME} (own uts namespace)"
    except OSError as exc:
        report.hostname = f"the host's, in an own uts namespace (sethostname: {exc.strerror})"


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
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the worker died before the line above
        os._exit(1)


def _mirror_exit(status: int) -> None:
    """End this process the way the one whose wait status is ``status`` ended."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        prctl(PR_SET_DUMPABLE, 0)  # no core dump of the waiter, whatever core_pattern says
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


def isolate(parent_pid: int) -> Isolation:
    """Isolate this sandbox child as far as the host permits; returns (in the process that
    goes on to run the solution) what was achieved. Call while single-threaded, with the
    scratch directory as cwd."""
    report = Isolation()
    report.cgroup = cgroups.join()  # before the first fork: every process starts inside
    scratch = os.getcwd()
    device = os.environ.get("KERNELRL_DEVICE", "cpu")
    uid = SANDBOX_UID_BASE + os.getpid()
    flags, in_user_ns = _unshare(report)
    report.namespaces = [name for flag, name in _NAMESPACES if flags & flag]
    if flags & CLONE_NEWNET:
        report.network = "userns+netns" if in_user_ns else "netns"
    if in_user_ns:
        report.namespaces.insert(0, "user")
    _report_ipc_and_uts(report, flags)

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
            needed = [p for p, _ in needed_paths(device)]
            report.filesystem = confine_filesystem(scratch, in_pid_ns, needed, device)
        except OSError as exc:
            report.filesystem = f"partly confined ({exc})"
    report.user = drop_privileges(scratch, uid, in_user_ns, device)

    if not in_pid_ns:
        report.processes = (
            "no pid namespace: its cgroup still pauses and kills every process"
            if report.cgroup.startswith("cgroup ")
            else "no pid namespace: a process that calls setsid can outlive the job"
        )
        die_with_parent(parent_pid)
        return report

    # init: dies with the waiter (set after the change of credentials, which clears it)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    prctl(PR_SET_DUMPABLE, 0)  # the job, same uid, may not ptrace it
    waiter_gone, _, _ = select.select([alive_r], [], [], 0)
    if waiter_gone:  # EOF: the waiter died before the death signal was set
        os._exit(1)
    job_pid = os.fork()
    if job_pid:
        _init(job_pid, status_w)  # never returns
    os.close(alive_r)
    os.close(status_w)
    prctl(PR_SET_DUMPABLE, 1)  # its own /proc/self/fd etc. stay its own (fork copied init's 0)
    report.processes = "own pid namespace: everything the job starts dies with it"
    return report
