"""Starting sandbox children: forked by this worker's fork server (``fork_server``, ``zygote``),
or each on its own interpreter with ``KERNELRL_SANDBOX_SPAWN=exec``; always with an environment
of their own and nothing of the worker's."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kernelrl.env.sandbox import cgroups
from kernelrl.env.sandbox.child_process import Child
from kernelrl.env.sandbox.fork_server import ForkServer
from kernelrl.env.sandbox.isolation_view import VIEW_PACKAGE_ENV, package_view
from kernelrl.env.sandbox.scratch import make_scratch
from kernelrl.env.sandbox.stream import Ring
from kernelrl.env.sandbox.triton_launchers import shared_launchers
from kernelrl.env.sandbox.triton_seed import triton_seed

# Only these variables reach the child: no credentials (WANDB_API_KEY, HF_TOKEN, ...) leak in.
_PASSED_ENV = (
    "PATH",
    "LANG",
    "LC_ALL",
    "CUDA_HOME",
    "CUDA_PATH",
    "LD_LIBRARY_PATH",
    "TRITON_PTXAS_PATH",
)
# Their values as this process started: read once, at import. torch's compiler sets
# TRITON_PTXAS_PATH (to the assembler torch ships) in any process that compiles with it, the
# trusted reference's ``torch.compile`` included, so children started after a reference was
# compiled assembled the same kernel text with another ptxas than those started before, and
# than their compile companion (Triton keys its cache by the assembler's version): every child of
# a worker gets the same toolchain.
_STARTED_ENV = {key: os.environ[key] for key in _PASSED_ENV if key in os.environ}
# Hardware work queues of a child's CUDA context, unless the worker's environment says
# otherwise. Every context's queues are made and torn down under the driver's lock, which all
# children of a GPU share, so the default 8 per context is what limits how fast fresh children
# become ready (docs/decisions.md, "One hardware queue per sandbox child"). Streams still work
# with one; their kernels share the queue (as under Megatron-LM's setting of it), which can
# only slow a solution that overlaps streams, never make one look faster: the reference runs
# on one stream.
CUDA_CONNECTIONS_ENV = "CUDA_DEVICE_MAX_CONNECTIONS"
DEFAULT_CUDA_CONNECTIONS = "1"


_spawner: tuple[int, ThreadPoolExecutor] | None = None
_spawner_lock = threading.Lock()


def spawn_child(device: str, gpu_index: int | None) -> Child:
    """A new child, forked by this process's one spawner thread.

    The child asks the kernel for SIGKILL when the thread that forked it ends
    (``PR_SET_PDEATHSIG`` is per thread, not per process): forked by an evaluation's thread, a
    child would die with that thread. The spawner thread lives until the process exits."""
    return _spawner_thread().submit(_spawn, device, gpu_index, CHILD).result()


def spawn_companion(device: str, gpu_index: int | None) -> Future[Child]:
    """A compile companion (``sandbox.compiler``) for a child of that device, started by the
    spawner thread while the caller goes on: a sandbox like a CPU child, with no GPU."""
    return _spawner_thread().submit(_spawn, device, gpu_index, COMPANION)


def _spawner_thread() -> ThreadPoolExecutor:
    global _spawner
    with _spawner_lock:
        if _spawner is None or _spawner[0] != os.getpid():  # a forked process starts its own
            _spawner = (os.getpid(), ThreadPoolExecutor(1, "kernelrl-sandbox-spawner"))
        return _spawner[1]


def visible_device(gpu_index: int) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` entry of this process's GPU ``gpu_index``: where this
    process sees only some of the host's GPUs (a scheduler's allocation), index 0 is the first
    of those, not the host's GPU 0."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if not visible:
        return str(gpu_index)
    entries = [entry.strip() for entry in visible.split(",")]
    if not 0 <= gpu_index < len(entries):
        raise ValueError(f"GPU {gpu_index} is not one of CUDA_VISIBLE_DEVICES={visible!r}")
    return entries[gpu_index]


@functools.cache
def _package_view() -> str:
    """What of kernelrl's package the child's filesystem shows (``isolation_view``): computed
    once per worker, not once per child."""
    return package_view()


def _companion_env(home: Path) -> dict[str, str]:
    """A CPU child's environment (no GPU device in its view, none visible to CUDA), without
    Triton's interpreter: it compiles for the GPU its child reports."""
    env = _child_env("cpu", None, home)
    del env["TRITON_INTERPRET"]
    return env


def _child_env(device: str, gpu_index: int | None, home: Path) -> dict[str, str]:
    env = dict(_STARTED_ENV)
    env[VIEW_PACKAGE_ENV] = _package_view()
    env.update(
        HOME=str(home),
        TMPDIR=str(home),
        TRITON_CACHE_DIR=str(home / "triton"),
        TORCH_EXTENSIONS_DIR=str(home / "torch_extensions"),
        PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONUNBUFFERED="1",
        KERNELRL_DEVICE=device,
        OMP_NUM_THREADS="1",
    )
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    else:
        env["CUDA_VISIBLE_DEVICES"] = visible_device(gpu_index if gpu_index is not None else 0)
        env[CUDA_CONNECTIONS_ENV] = os.environ.get(CUDA_CONNECTIONS_ENV, DEFAULT_CUDA_CONNECTIONS)
    return env


SPAWN_ENV = "KERNELRL_SANDBOX_SPAWN"
_fork_servers: dict[tuple[int, str, int | None], ForkServer] = {}


def _fork_server(device: str, gpu_index: int | None) -> ForkServer:
    """This process's fork server for the device, started (again) when there is none alive.
    It has the children's environment, its own scratch directory as their home."""
    key = (os.getpid(), device, gpu_index)
    server = _fork_servers.get(key)
    if server is None or not server.alive():
        if server is not None:
            server.close()
        home = make_scratch("zygote")
        atexit.register(shutil.rmtree, home, True)
        server = _fork_servers[key] = ForkServer(_child_env(device, gpu_index, home), home)
    return server


def _exec_child(
    scratch: Path, env: dict[str, str], channel: socket.socket, log: int, entry: str
) -> Any:
    """A child started on its own interpreter: what the fork server saves (its imports), kept
    to measure that saving side by side and as the way round a host where forking fails."""
    return subprocess.Popen(
        [sys.executable, "-m", f"kernelrl.env.sandbox.{entry}", "stdin", str(os.getpid())],
        cwd=scratch,
        env=env,
        stdin=channel,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: a kill takes all it spawned
    )


CHILD, COMPANION = "child", "compiler"  # what a sandbox process runs: its entry module


def _spawn(device: str, gpu_index: int | None, entry: str) -> Child:
    """Children come from the fork server unless ``KERNELRL_SANDBOX_SPAWN=exec``; a companion
    from the same one, as it holds no CUDA context."""
    if os.environ.get(SPAWN_ENV) == "exec":
        start = functools.partial(_exec_child, entry=entry)
    else:
        start = functools.partial(_fork_server(device, gpu_index).fork, entry=entry)
    scratch = make_scratch("sbx" if entry == CHILD else "cmp")
    parent_sock, child_sock = socket.socketpair()
    env = _child_env(device, gpu_index, scratch) if entry == CHILD else _companion_env(scratch)
    cgroup, why_not = cgroups.make()
    if cgroup is not None:
        env[cgroups.CGROUP_ENV] = str(cgroup.path)
    else:
        env[cgroups.UNAVAILABLE_ENV] = why_not
    log = open(scratch / "child.log", "wb")  # noqa: SIM115 - handed to the child
    ring = Ring.create() if entry == CHILD else None  # a companion's outputs never come back
    try:
        seed = triton_seed(device, gpu_index) if entry == CHILD else None
        if seed is not None:  # its own copy: what it compiles stays its own
            shutil.copytree(seed, env["TRITON_CACHE_DIR"])
        if entry == CHILD and device == "cuda":
            shared_launchers().copy_into(env["TRITON_CACHE_DIR"])
        process = start(scratch, env, child_sock, log.fileno())
    except BaseException:
        if ring is not None:
            ring.close()
        if cgroup is not None:
            cgroups.release(cgroup)
        parent_sock.close()
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    finally:
        log.close()
        child_sock.close()
    return Child(
        process=process,
        sock=parent_sock,
        scratch=scratch,
        started=time.monotonic(),
        cgroup=cgroup,
        ring=ring,
    )
