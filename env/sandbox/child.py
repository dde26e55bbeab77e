"""The sandboxed child: the only process that ever executes a generated solution.

Forked by the worker's fork server (``sandbox.zygote``, which has imported this module) or
started on its own (``python -m kernelrl.env.sandbox.child stdin PARENT_PID``), its protocol
socket as standard input, ahead of time, so that ``import torch``, the CUDA context and CUPTI
are paid while another evaluation runs. It then waits for exactly one job,
serves it call by call as the worker asks (``job``), and exits: no state survives from one
solution to the next. Everything it reports goes through the socket; the worker decides every
verdict itself and believes none of the child's claims that it can check on its own side.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
import time
from typing import Any

# Isolation (namespaces, read-only filesystem, an unprivileged user: sandbox.isolation) must
# happen before torch starts its threads: unshare moves only the calling thread. With a PID
# namespace, only the process that will run the solution returns from isolate().
NETWORK = "not isolated"
ISOLATION = "not isolated"
if __name__ == "__main__":
    from kernelrl.env.sandbox.isolation import isolate

    _isolation = isolate(int(sys.argv[2]))
    NETWORK, ISOLATION = _isolation.network, _isolation.describe()
_IMPORT_STARTED = time.perf_counter()

import random  # noqa: E402
import socket  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from kernelrl.env.integrity.audit import AtenAudit, LaunchCounter, guard_dispatch_stack  # noqa: E402
from kernelrl.env.sandbox.device_ring import DeviceRing, refusal  # noqa: E402
from kernelrl.env.sandbox.failures import HarnessFailure, report_failure  # noqa: E402
from kernelrl.env.sandbox.job import Job  # noqa: E402
from kernelrl.env.sandbox.protocol import SOLUTION_MODULE, recv_message, send_message  # noqa: E402
from kernelrl.env.sandbox.stream import OutputRing, Ring, StreamError, receive_rings  # noqa: E402


def apply_limits(limits: dict[str, Any], device: torch.device) -> None:
    """Our limits, never above what this process may already use: a hard limit set by the
    machine (``ulimit -v``) is kept as it is rather than failing the evaluation."""

    def cap(kind: int, value: int) -> None:
        _, hard = resource.getrlimit(kind)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(kind, (value, value if hard != resource.RLIM_INFINITY else hard))

    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        cap(resource.RLIMIT_FSIZE, int(limits["file_bytes"]))
        cap(resource.RLIMIT_CPU, int(limits["cpu_seconds"]))
        if device.type == "cpu" and limits.get("address_space_bytes"):
            cap(resource.RLIMIT_AS, int(limits["address_space_bytes"]))
        if device.type == "cuda" and limits.get("gpu_memory_fraction"):
            torch.cuda.set_per_process_memory_fraction(float(limits["gpu_memory_fraction"]))
    except (OSError, ValueError) as exc:
        raise HarnessFailure(f"could not apply the sandbox's limits: {exc}") from exc


@triton.jit
def _warm_kernel(ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(ptr + offsets, tl.load(ptr + offsets, mask=offsets < n) + 1.0, mask=offsets < n)


def warm_up(device: torch.device, counter: LaunchCounter) -> dict[str, float]:
    """Pay, before any job arrives, what the first evaluation would otherwise pay inside its
    phases: the CUDA context, CUPTI's start (4 to 6 s on an H100 host) and what torch imports
    the first time a Triton kernel is launched under a dispatch mode (about 5 s)."""
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.init()
        torch.zeros(1, device=device)
        seconds["cuda_init_seconds"] = time.perf_counter() - start
        start = time.perf_counter()
        from torch.profiler import ProfilerActivity, profile

        marker = torch.zeros(1, device=device)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            marker.fill_(1.0)
            torch.cuda.synchronize()
        list(prof.profiler.kineto_results.events())
        seconds["profiler_init_seconds"] = time.perf_counter() - start
        start = time.perf_counter()
    buffer = torch.zeros(64, device=device)
    with torch.no_grad(), AtenAudit(counter):
        _warm_kernel[(1,)](buffer, buffer.numel(), BLOCK=64)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds["audit_init_seconds"] = time.perf_counter() - start
    return seconds


def page_locked(ring: Ring) -> dict[str, float]:
    """The ring page-locked for the CUDA context ``warm_up`` made (a device copy into it is
    then direct); what it cost."""
    start = time.perf_counter()
    ring.page_lock()
    return {"ring_lock_seconds": time.perf_counter() - start}


def output_ring(
    ring: Ring, offered: tuple[int, int] | None, device: torch.device
) -> tuple[OutputRing, dict[str, Any]]:
    """The ring this child's outputs go through: the device ring the worker offered, mapped in
    the CUDA context ``warm_up`` made, else the host ring (page-locked there); the choice, and
    why not the device ring, go to the worker in the ready message, before any solution ran."""
    refused: dict[str, str] = {}
    if offered is not None:
        fd, size = offered
        start = time.perf_counter()
        try:
            mapped = DeviceRing.attach(fd, size, device)
            return mapped, {
                "output_ring": "device",
                "ring_map_seconds": time.perf_counter() - start,
            }
        except Exception as exc:  # noqa: BLE001 - ours, before any solution: said, never fatal
            refused = {"device_ring_refused": refusal(exc)}
    return ring, {"output_ring": "host", **refused, **page_locked(ring)}


def take_channel() -> socket.socket:
    """The protocol socket arrives as standard input; it is moved to an fd number drawn at
    random and standard input becomes /dev/null: neither argv nor the environment names it."""
    target = random.SystemRandom().randrange(300, 900)
    os.dup2(0, target)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    return socket.socket(fileno=target)


def cpu_seconds() -> float:
    """CPU time this process has used so far (user and system)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def pass_gate(sock: socket.socket, import_seconds: float) -> tuple[Ring, tuple[int, int] | None]:
    """Everything so far was CPU work; the CUDA context, CUPTI and the warm-up kernel come only
    once the worker says so, never while it measures another evaluation (processes.ChildPool);
    the rings the outputs' bytes go through come just before that word. A worker that hangs up
    instead ends the child."""
    send_message(
        sock,
        {"type": "imported", "import_seconds": import_seconds, "import_cpu_seconds": cpu_seconds()},
    )
    try:
        rings = receive_rings(sock)
        go = recv_message(sock)
    except (EOFError, OSError, StreamError):
        os._exit(0)
    if go.get("type") != "warm":
        os._exit(0)
    return rings


def main() -> None:
    sock = take_channel()
    imported = time.perf_counter()
    host_ring, offered = pass_gate(sock, imported - _IMPORT_STARTED)
    gate_passed = time.perf_counter()
    device = torch.device(os.environ.get("KERNELRL_DEVICE", "cpu"))
    counter = LaunchCounter()
    counter.install(SOLUTION_MODULE)
    guard_dispatch_stack()
    warmed = warm_up(device, counter)
    ring, chosen = output_ring(host_ring, offered, device)
    ready = {
        "type": "ready",
        "pid": os.getpid(),
        "import_seconds": imported - _IMPORT_STARTED,
        "network": NETWORK,
        "isolation": ISOLATION,
        **warmed,
        **chosen,
        "gate_seconds": gate_passed - imported,
        "cpu_seconds": cpu_seconds(),
    }
    send_message(sock, ready)
    try:
        job = recv_message(sock)
    except EOFError:
        os._exit(0)
    worker = None
    try:
        apply_limits(job["limits"], device)
        worker = Job(sock, ring, job, counter, sys.modules[__name__])
        worker.serve()
    except (EOFError, BrokenPipeError, ConnectionError):
        pass  # the trusted side hung up: nothing left to report to
    except BaseException as exc:  # noqa: BLE001 - every failure is reported, none kills silently
        with contextlib.suppress(OSError):
            report_failure(sock, exc, worker.phase if worker else {})
        # Alive until the worker hangs up: it reads this process's GPU memory from the driver
        # to tell whether the device was short (an exit now would free it under its eyes).
        with contextlib.suppress(Exception):
            recv_message(sock)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def run_forked(parent_pid: int) -> None:
    """Entry of a child forked by the fork server, which imported all of the above: the same
    isolation, at the same point (before any thread or solution), then ``main``."""
    global NETWORK, ISOLATION, _IMPORT_STARTED
    from kernelrl.env.sandbox.isolation import isolate

    _IMPORT_STARTED = time.perf_counter()
    isolation = isolate(parent_pid)
    NETWORK, ISOLATION = isolation.network, isolation.describe()
    main()


if __name__ == "__main__":
    main()
