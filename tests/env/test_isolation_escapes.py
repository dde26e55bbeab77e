"""Escapes from an evaluation's isolation, through the real sandbox on CPU: SysV IPC objects
left for the next evaluation, a process that leaves the sandbox's session to keep running while
its child is paused (as while another evaluation is timed) or after it ended, the host's name.

Solutions are in tests/solutions/isolation/. Static checks are off so that the sandbox is tested
on its own. Whether the host permits a namespace or a cgroup is asked of the host itself, not of
the sandbox: where it does not, the test skips saying why; where it does, the sandbox must have
used it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest

from kernelrl.env.evaluator import EvalConfig
from kernelrl.env.pools.local import LocalPool
from kernelrl.env.result import EvalResult, Status
from kernelrl.env.sandbox import cgroups
from kernelrl.env.sandbox.child_process import Child
from kernelrl.env.sandbox.processes import ChildPool
from kernelrl.env.sandbox.session import SandboxSession
from kernelrl.env.task import load_task
from kernelrl.env.timing import TimingConfig

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = Path(__file__).resolve().parents[1] / "solutions" / "isolation"
RELU_TASK = load_task(ROOT / "data" / "tasks" / "01_relu.py")
KEY = 0x4B000000 + secrets.randbelow(0x00FFFFFF)  # SysV key of this run
SPINNER_MARKER = f"kernelrl-spinner-{uuid.uuid4().hex}"
IPC_RMID = 0


def solution(name: str) -> str:
    text = (SOLUTIONS / name).read_text()
    return text.replace("0x6B726C00", hex(KEY)).replace("kernelrl-spinner-marker", SPINNER_MARKER)


def probe_of(result: EvalResult) -> dict:
    """What a probing solution reported through its error message."""
    assert result.status is Status.RUNTIME_ERROR, (result.status, result.feedback)
    text = result.error or result.feedback
    assert "PROBE" in text, text
    return json.loads(text.split("PROBE")[-2])


CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUTS = 0x04000000


def require_namespace(flag: int, name: str) -> None:
    """Skip where this host refuses the namespace as the sandbox asks for it: directly, or
    inside a new user namespace (asked in a process of its own, which then exits)."""
    code = (
        "import ctypes, os, sys\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"if libc.unshare({flag}) == 0 or libc.unshare({flag | CLONE_NEWUSER}) == 0:\n"
        "    sys.exit(0)\n"
        "print(os.strerror(ctypes.get_errno()))\n"
        "sys.exit(1)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"this host refuses a {name} namespace: unshare: {done.stdout.strip()}")


def require_cgroup() -> None:
    """Skip where this host lets us make no cgroup v2 under our own with freeze and kill."""
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    mount = next((line.split() for line in mounts if " - cgroup2 " in line), None)
    if mount is None:
        pytest.skip("this host has no cgroup v2 hierarchy mounted")
    own = [line[3:] for line in Path("/proc/self/cgroup").read_text().split() if line[:3] == "0::"]
    trial = Path(mount[4]) / os.path.relpath(own[0], mount[3]) / f"kernelrl-test-{os.getpid()}"
    try:
        trial.mkdir()
    except OSError as exc:
        pytest.skip(f"this host lets us make no cgroup: mkdir {trial}: {exc.strerror}")
    try:
        missing = [n for n in ("cgroup.freeze", "cgroup.kill") if not (trial / n).exists()]
    finally:
        trial.rmdir()
    if missing:
        pytest.skip(f"this host's cgroups have no {missing} (kernel older than 5.14)")


def cgroup_of(pid: int) -> str:
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    return next(line[3:] for line in lines if line.startswith("0::"))


def host_ipc_ids(key: int) -> dict[str, list[int]]:
    """Ids of the host's SysV objects under ``key`` (what ``ipcs`` lists), by kind."""
    found: dict[str, list[int]] = {}
    for kind in ("shm", "sem", "msg"):
        lines = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]
        found[kind] = [int(line.split()[1]) for line in lines if int(line.split()[0]) == key]
    return found


def remove_host_ipc(key: int) -> None:
    """Remove what an evaluation left on the host (the old, unisolated behaviour)."""
    libc = ctypes.CDLL(None, use_errno=True)
    ids = host_ipc_ids(key)
    for shmid in ids["shm"]:
        libc.shmctl(shmid, IPC_RMID, None)
    for semid in ids["sem"]:
        libc.semctl(semid, 0, IPC_RMID)
    for msqid in ids["msg"]:
        libc.msgctl(msqid, IPC_RMID, None)


@pytest.fixture(scope="module")
def results() -> Iterator[dict[str, EvalResult]]:
    """Evaluations one after the other in one pool: the first leaves SysV objects and probes
    the hostname, the second looks for the objects."""
    config = EvalConfig(
        device="cpu", timeout_s=60, host_memory_bytes=2 * 2**30, static_checks=False
    )
    hostname = socket.gethostname()
    try:
        with LocalPool(config, workers=1) as pool:
            first = pool.evaluate(
                [RELU_TASK] * 2, [solution("sysv_create.py"), solution("hostname_probe.py")]
            )
            host_after_first = host_ipc_ids(KEY)
            (second,) = pool.evaluate([RELU_TASK], [solution("sysv_lookup.py")])
        yield {
            "create": first[0],
            "hostname": first[1],
            "lookup": second,
            "host_ipc_after_first": host_after_first,  # type: ignore[dict-item]
            "host_name_before": hostname,  # type: ignore[dict-item]
        }
    finally:
        remove_host_ipc(KEY)


def test_sysv_ipc_dies_with_its_evaluation(results: dict) -> None:
    made = probe_of(results["create"])
    assert all(ident >= 0 for ident in made.values()), made  # it did make all three
    require_namespace(CLONE_NEWIPC, "ipc")
    assert results["host_ipc_after_first"] == {"shm": [], "sem": [], "msg": []}, (
        "SysV objects of an ended evaluation are still resident on the host"
    )
    found = probe_of(results["lookup"])
    enoent = -2
    assert found == {"shm": enoent, "sem": enoent, "msg": enoent}, found
    assert "ipc: own namespace" in results["create"].sandbox["isolation"]


def test_hostname_is_the_sandboxs_own(results: dict) -> None:
    seen = probe_of(results["hostname"])
    require_namespace(CLONE_NEWUTS, "uts")
    assert seen["hostname"] == "kernelrl-sandbox" != results["host_name_before"], seen
    assert seen["sethostname"] != "ok" and seen["after"] == "kernelrl-sandbox", seen
    assert socket.gethostname() == results["host_name_before"]
    assert "hostname: kernelrl-sandbox" in results["hostname"].sandbox["isolation"]


# ---------------------------------------------------------------------- pause and kill


def processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                cmdline = Path(entry.path, "cmdline").read_bytes()
                state = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if marker.encode() in cmdline and state not in "ZX":
                found.append(int(entry.name))
    return found


def read_counter(child: Child) -> int:
    try:
        return int((child.scratch / "counter").read_text() or 0)
    except (OSError, ValueError):
        return 0


def wait_for_progress(child: Child, seconds: float) -> bool:
    """Whether the counter moves within ``seconds``."""
    start = read_counter(child)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)
        if read_counter(child) != start:
            return True
    return False


def start_spinner(child: Child) -> SandboxSession:
    """Run the spinner solution's first forward call in ``child``; the child then waits for
    its next call, as it would while another evaluation is timed."""
    session = SandboxSession(child, timeout_s=120, max_rss_bytes=None)
    loaded = session.start(
        {
            "device": "cpu",
            "backend": RELU_TASK.backend,
            "task_source": RELU_TASK.source,
            "size_overrides": RELU_TASK.size_overrides("cpu"),
            "solution_source": solution("setsid_spinner.py"),
            "model_seed": 1,
            "timing": asdict(TimingConfig()),
            "profile_calls": 1,
            "gpu_bytes_admitted": None,
            "limits": {
                "file_bytes": 2**26,
                "cpu_seconds": 120,
                "address_space_bytes": None,
                "gpu_memory_fraction": None,
            },
        }
    )
    assert loaded["type"] == "loaded", loaded
    session.send_call(7)
    outputs = session.receive()
    assert outputs["type"] == "outputs", outputs
    session.read_tensors(outputs["outputs"], lambda index, chunk: None)
    return session


@pytest.fixture(params=["cgroup", "signals"])
def mechanism(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways the worker reaches every process: the child's cgroup where the host allows
    one, signals to every process of its PID namespace where it does not."""
    if request.param == "signals":
        monkeypatch.setattr(cgroups, "make", lambda: (None, "switched off by the test"))
    return request.param


def test_pause_and_kill_reach_a_process_that_left_the_session(mechanism: str) -> None:
    if mechanism == "cgroup":
        require_cgroup()
    else:
        require_namespace(CLONE_NEWPID, "pid")  # where the namespace's init inherits orphans
    children = ChildPool("cpu", spare=0)
    child = children.acquire()
    try:
        in_own_cgroup = "kernelrl-sbx-" in cgroup_of(child.process.pid)
        assert in_own_cgroup == (mechanism == "cgroup"), cgroup_of(child.process.pid)
        start_spinner(child)
        assert wait_for_progress(child, 20), "the spinner never started"
        (spinner,) = processes_with(SPINNER_MARKER)
        stat = Path(f"/proc/{spinner}/stat").read_text().rsplit(")", 1)[1].split()
        assert int(stat[3]) == spinner != os.getpgid(child.process.pid)  # its own session

        for _ in range(2):  # paused as during another evaluation's measurement, then resumed
            child.pause()
            before = read_counter(child)
            time.sleep(0.6)
            assert read_counter(child) == before, "a process of the paused child kept running"
            assert child.paused()
            child.resume()
            assert wait_for_progress(child, 10), "the resumed child did not run again"

        child.pause()  # killed while paused, as when its deadline passes during a measurement
        child.close()
        assert processes_with(SPINNER_MARKER) == [], "a process outlived its evaluation"
        if child.cgroup is not None:
            assert not child.cgroup.path.exists(), "the evaluation's cgroup was left behind"
        isolation = child.ready_info["isolation"]
        if mechanism == "cgroup":
            assert f"; cgroup {child.cgroup.path} (frozen and killed as one)" in isolation
        else:
            assert "; no cgroup (switched off by the test): paused and killed by" in isolation
    finally:
        child.close()
        children.close()


def test_cgroups_of_a_dead_worker_are_removed_by_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker killed by SIGKILL cannot remove its children's (empty) cgroups: the next worker
    that makes one on the host removes them."""
    require_cgroup()
    dead = subprocess.Popen(["true"])
    dead.wait()
    made, _ = cgroups.make()
    assert made is not None
    left = made.path.parent / f"kernelrl-sbx-{dead.pid}-0"
    try:
        left.mkdir()
        monkeypatch.setattr(cgroups, "_base", None)  # as a worker process that starts now
        again, _ = cgroups.make()
        assert again is not None and again.path.is_dir()
        assert not left.exists(), "the dead worker's cgroup was left behind"
        cgroups.release(again)
    finally:
        cgroups.release(made)
        with contextlib.suppress(OSError):
            left.rmdir()


def test_a_solution_cannot_resize_the_output_ring() -> None:
    """The ring the outputs' bytes come through is sealed by the worker: a solution that
    truncates every shared-memory file it holds is judged on its outputs, and neither the
    worker's mapping nor the harness's faults."""
    config = EvalConfig(
        device="cpu", timeout_s=60, host_memory_bytes=2 * 2**30, static_checks=False
    )
    with LocalPool(config, workers=1) as pool:
        (result,) = pool.evaluate([RELU_TASK], [solution("ring_truncate.py")])
    assert result.status is Status.CORRECT, result.feedback
