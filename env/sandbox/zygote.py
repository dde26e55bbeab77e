"""The fork server: imports torch, Triton and the sandbox child's code once, then forks every
sandbox child from that state.

Importing is the largest CPU cost of a child that is never reused, and the host's cores, not
the GPU, bound how many evaluations a GPU gets (docs/decisions.md, "A fork server for sandbox
children"). A forked child shares those pages copy-on-write instead of importing again.

This process is trusted but holds nothing worth taking: it is started with the children's own
sanitised environment, never loads a task or a solution, and never makes a CUDA context (which
would not survive the fork). A forked child first drops every descriptor but the two it was
sent (its protocol socket and its log), so it cannot ask this server for anything, then
isolates itself exactly as a child started with ``python -m kernelrl.env.sandbox.child`` does
(``sandbox.isolation``): ``fork`` copies only the calling thread, so the child is
single-threaded, as ``unshare`` needs.

Protocol, on a ``SOCK_SEQPACKET`` pair (one message per datagram, descriptors attached):
worker -> server ``{"cwd", "env", "entry"}`` with [channel, log] (``entry``: ``child``, or
``compiler`` for a compile companion); server -> worker
``{"type": "forked", "pid"}`` with a pidfd of the child (safe against pid reuse), or
``{"type": "failed", "error"}``; and ``{"type": "exit", "pid", "status"}`` when a child ends
(only its parent can read its wait status).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import signal
import socket
import sys
import tempfile
import warnings

from kernelrl.env.sandbox.linux import PR_SET_DUMPABLE, PR_SET_PDEATHSIG, prctl

MAX_REQUEST_BYTES = 1 << 20
# What a child's warm-up would otherwise import the first time it launches a Triton kernel under
# the audit's dispatch mode, and the profiler it starts: pure Python, no CUDA, 800-odd modules.
PRELOADED = (
    "torch._dynamo",
    "torch._higher_order_ops.triton_kernel_wrap",
    "torch.profiler",
    "triton.compiler.code_generator",
)
REAP_INTERVAL_S = 0.02
# What a forked process runs, by the request's ``entry``: a sandbox child or a compile companion.
ENTRIES = {
    "child": "kernelrl.env.sandbox.child",
    "compiler": "kernelrl.env.sandbox.compiler",
}


def _send(control: socket.socket, message: dict, fds: tuple[int, ...] = ()) -> None:
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(control, [data], list(fds))
    else:
        control.send(data)


def _reap(control: socket.socket) -> None:
    """Report every child that has ended; only this process, their parent, sees how."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(control, {"type": "exit", "pid": pid, "status": status})


def _become_child(request: dict, channel: int, log: int, server_pid: int) -> None:
    """In the forked process: take the child's descriptors, environment and directory, then
    run the sandbox child as if it had been started on its own. Never returns."""
    try:
        os.setsid()  # its own session and process group: Child.kill's killpg takes all of it
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.dup2(channel, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # the server's channel above all
        prctl(PR_SET_DUMPABLE, 1)  # as after exec: its /proc files are its own
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        tempfile.tempdir = None  # gettempdir() reads the child's TMPDIR, not the server's
        sys.path.insert(0, request["cwd"])  # as ``python -m`` in that directory would have
        entry = ENTRIES[request.get("entry", "child")]
        sys.argv = [entry, "stdin", str(server_pid)]
        importlib.import_module(entry).run_forked(server_pid)
    except BaseException as exc:  # noqa: BLE001 - the worker reads the log and the exit code
        with contextlib.suppress(OSError):
            os.write(2, f"forked sandbox child failed to start: {exc!r}\n".encode())
    os._exit(70)


def serve(control: socket.socket) -> None:
    server_pid = os.getpid()
    while True:
        readable, _, _ = select.select([control], [], [], REAP_INTERVAL_S)
        _reap(control)
        if not readable:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(control, MAX_REQUEST_BYTES, 2)
        except (ConnectionError, OSError):
            os._exit(0)
        if not data:  # the worker hung up: its children die with this process
            os._exit(0)
        try:
            request = json.loads(data)
            if len(fds) != 2:
                raise ValueError(f"expected 2 descriptors, got {len(fds)}")
            pid = os.fork()
            if pid == 0:
                _become_child(request, fds[0], fds[1], server_pid)
            pidfd = os.pidfd_open(pid)
            _send(control, {"type": "forked", "pid": pid}, (pidfd,))
            os.close(pidfd)
        except (OSError, ValueError, KeyError) as exc:
            _send(control, {"type": "failed", "error": f"{type(exc).__name__}: {exc}"})
        finally:
            for fd in fds:
                os.close(fd)


def warm_triton() -> None:
    """Triton's hash of its own build (``triton_key``: every file of its compiler and its
    500-MB shared library), which it computes at a process's first compile and caches for the
    process: computed here once, it is every forked process's without its 0.3 s of CPU. A
    child's warm-up paid it off the evaluation's path, a compile companion on it, before the
    kernel its child was waiting for."""
    from triton.runtime.cache import triton_key

    triton_key()


def main() -> None:
    worker_pid = int(sys.argv[1])
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # dies with the worker's spawner thread...
    if os.getppid() != worker_pid:
        os._exit(1)
    # ...and takes its children along (they die with their parent: sandbox.isolation).
    prctl(PR_SET_DUMPABLE, 0)  # a child that stays at our uid may not ptrace the server
    if sys.path and sys.path[0] == os.getcwd():  # ``-m`` put our directory first: not theirs
        sys.path.pop(0)
    control = socket.socket(fileno=os.dup(0))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    # Torch starts a thread at import; fork copies only ours, which is what the child needs.
    warnings.filterwarnings("ignore", message=".*multi-threaded.*fork", category=DeprecationWarning)
    # torch, triton, the harness, the audit; a compile companion's own code
    from kernelrl.env.sandbox import child, compiler  # noqa: F401

    for name in PRELOADED:
        importlib.import_module(name)
    warm_triton()
    _send(control, {"type": "ready", "modules": len(sys.modules)})
    serve(control)


if __name__ == "__main__":
    main()
