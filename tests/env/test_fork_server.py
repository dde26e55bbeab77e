"""The fork server (sandbox.zygote): children are forked from one process that imported torch
once, hold nothing of it, and the pool recovers when it dies."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from kernelrl.env.evaluator import EvalConfig, Evaluator
from kernelrl.env.result import Status
from kernelrl.env.sandbox import spawn
from kernelrl.env.sandbox.child_process import Child, ChildDied
from kernelrl.env.sandbox.fork_server import ForkServer
from kernelrl.env.sandbox.processes import ChildPool
from kernelrl.env.task import load_task


def _parent(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    raise AssertionError(f"no PPid for {pid}")


def _socket_inodes(pid: int) -> set[str]:
    found = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:"):
            found.add(target)
    return found


def _server() -> ForkServer:
    return spawn._fork_server("cpu", None)


def test_children_are_forked_by_one_server_and_hold_none_of_its_descriptors() -> None:
    children = ChildPool("cpu", spare=0)
    first = second = None
    try:
        first, second = children.acquire(), children.acquire()
        server_pid = _server().process.pid
        assert _parent(first.process.pid) == _parent(second.process.pid) == server_pid
        try:
            server_sockets = _socket_inodes(server_pid)
            seen = [_socket_inodes(pid) for child in (first, second) for pid in child._tree()]
        except PermissionError:
            pytest.skip("cannot read other processes' descriptors here")
        # Only the server's channel to the worker is a socket it keeps: no child has it.
        assert server_sockets and not any(server_sockets & inodes for inodes in seen)
    finally:
        for child in (first, second):
            if child is not None:
                child.close()
        children.close()


def test_a_dead_server_takes_its_children_and_the_next_child_comes_from_a_new_one() -> None:
    children = ChildPool("cpu", spare=0)
    orphan = replacement = None
    try:
        orphan = children.acquire()
        old = _server()
        os.kill(old.process.pid, signal.SIGKILL)
        assert orphan.process.wait(timeout=15) == -signal.SIGKILL  # died with its parent
        assert orphan.died().ours and "fork server died" in orphan.describe_exit()
        deadline = time.monotonic() + 10
        while old.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        replacement = children.acquire()
        assert _server() is not old and replacement.process.poll() is None
        assert replacement.ready_info.get("type") == "ready"
    finally:
        for child in (orphan, replacement):
            if child is not None:
                child.close()
        children.close()


def test_a_channel_closed_by_the_pool_while_it_is_read_ends_as_ours() -> None:
    """A pool closing (Ctrl-C) closes its children's sockets while another thread may be
    reading one of them (the gate's keeper waits for a child's "imported"): that read ends as
    the child lost by our side, never as an exception that kills the reading thread or as the
    solution's failure."""
    children = ChildPool("cpu", spare=0)
    child = children.acquire()
    try:
        lost: list[BaseException] = []

        def read() -> None:
            try:
                child.receive(time.monotonic() + 30)
            except BaseException as exc:  # noqa: BLE001 - what the reader saw is the test
                lost.append(exc)

        reader = threading.Thread(target=read)
        reader.start()
        time.sleep(0.3)  # the reader is waiting on the socket
        child.sock.close()
        reader.join(5)
        assert not reader.is_alive()
        assert len(lost) == 1 and type(lost[0]) is ChildDied and lost[0].ours, lost
    finally:
        child.close()
        children.close()


@pytest.mark.parametrize("read", ["message", "chunk"])
def test_a_channel_closed_between_the_wait_and_the_read_ends_as_ours(read: str) -> None:
    """The pool may close the channel after the wait saw it readable and before the read
    starts: a message's read and a tensor chunk's read (whose timeout is set on the socket
    first) both end as the child lost by our side."""
    children = ChildPool("cpu", spare=0)
    child = children.acquire()
    wait = child._wait_readable

    def wait_then_close(*args) -> None:
        wait(*args)
        child.sock.close()  # what the pool's other thread does in that window

    try:
        os.killpg(child.process.pid, signal.SIGKILL)  # its end of the channel now reads
        child.process.wait(timeout=15)
        child._wait_readable = wait_then_close
        with pytest.raises(ChildDied) as lost:
            if read == "message":
                child.receive(time.monotonic() + 30)
            else:
                child.receive_into(memoryview(bytearray(8)), time.monotonic() + 30)
        assert lost.value.ours and not lost.value.timed_out
    finally:
        child.close()
        children.close()


def test_a_forked_childs_exit_status_reaches_the_worker() -> None:
    children = ChildPool("cpu", spare=0)
    child = children.acquire()
    try:
        os.killpg(child.process.pid, signal.SIGSEGV)
        assert child.process.wait(timeout=15) == -signal.SIGSEGV
        assert "SIGSEGV" in child.describe_exit()
    finally:
        child.close()
        children.close()


def test_a_child_forked_during_a_measurement_starts_once_it_ends() -> None:
    """A child forked while another is measured is stopped at once, possibly before it has
    made its own process group: resuming must still reach it, or it never starts."""
    children = ChildPool("cpu", spare=0, ready_timeout_s=30, import_timeout_s=600)
    kept = children.acquire()
    started = []
    try:
        for _ in range(4):
            with children.paused_except(kept):
                children.spare = 1
                children.warm()
                children.spare = 0
            asked = time.monotonic()
            started.append(children.acquire())  # the one forked and stopped above
            assert time.monotonic() - asked < 25, "a child stayed stopped: a start was retried"
    finally:
        for child in (kept, *started):
            child.close()
        children.close()


def test_a_child_lost_with_its_fork_server_is_our_failure_not_the_solutions() -> None:
    """The fork server dying kills the children it forked: an evaluation in flight then ends
    in a harness error (retried, never scored), not in the solution's runtime_error."""
    root = Path(__file__).resolve().parents[2]
    task = load_task(root / "data" / "tasks" / "01_relu.py")
    spinning = (root / "tests" / "solutions" / "dynamic" / "timeout__infinite_loop.py").read_text()
    evaluator = Evaluator(EvalConfig(device="cpu", timeout_s=120))
    killer = threading.Timer(3.0, lambda: os.kill(_server().process.pid, signal.SIGKILL))
    acquire = evaluator.children.acquire

    def acquire_then_kill_the_server_soon() -> Child:
        child = acquire()
        killer.start()  # the solution spins by then
        return child

    evaluator.children.acquire = acquire_then_kill_the_server_soon
    try:
        result = evaluator.evaluate(task, spinning)
    finally:
        killer.cancel()
        evaluator.close()
    assert result.status is Status.HARNESS_ERROR, (result.status, result.error)
    assert "fork server died" in result.error and not result.scored


def test_a_retired_child_is_killed_at_once_and_reaped_before_its_memory_is_given_back() -> None:
    """The evaluation's slot is free as soon as its child is retired: the child is killed
    then (it is never paused again), its exit and scratch directory are reaped in the
    background, and only then is its admitted memory given back; closing the pool waits for
    every reap."""
    children = ChildPool("cpu", spare=0)
    child = children.acquire()
    seen: list[tuple[int | None, bool]] = []
    try:
        children.retire(
            child, then=lambda: seen.append((child.process.poll(), child.scratch.exists()))
        )
        assert child.killed_for == "evaluation over"
        assert child not in children._live
    finally:
        children.close()
    assert seen == [(-signal.SIGKILL, False)]


def test_a_child_starts_from_its_own_writable_copy_of_the_triton_seed(
    monkeypatch, tmp_path
) -> None:
    """On a GPU every child's Triton cache starts as a copy of the worker's seed (the driver
    utilities and the warm-up kernel, built once): the copy is the child's to write, as a cache
    it fills itself is, and what it writes never reaches the seed."""
    seed = tmp_path / "seed"
    (seed / "utils").mkdir(parents=True)
    (seed / "utils" / "built.txt").write_text("seeded")
    monkeypatch.setattr(spawn, "triton_seed", lambda device, gpu_index: seed)
    root = Path(__file__).resolve().parents[2]
    task = load_task(root / "data" / "tasks" / "01_relu.py")
    solution = (root / "data" / "solutions" / "triton" / "01_relu.py").read_text()
    solution = solution.replace(
        "        super().__init__()",
        "        super().__init__()\n"
        "        import os, pathlib\n"
        "        cache = pathlib.Path(os.environ['TRITON_CACHE_DIR'])\n"
        "        assert (cache / 'utils' / 'built.txt').read_text() == 'seeded'\n"
        "        (cache / 'utils' / 'mine.txt').write_text('x')\n"
        "        (cache / 'new').mkdir()",
    )
    # The file access is what is tested, not whether a solution may do it (it may not).
    config = EvalConfig(device="cpu", timeout_s=120, spare_children=0, static_checks=False)
    with Evaluator(config) as evaluator:
        result = evaluator.evaluate(task, solution)
    assert result.status is Status.CORRECT, result.error
    assert sorted(p.name for p in seed.rglob("*")) == ["built.txt", "utils"]


@pytest.mark.gpu
def test_the_triton_seed_holds_the_driver_utilities_and_the_warm_up_kernel() -> None:
    from kernelrl.env.sandbox.triton_seed import triton_seed

    seed = triton_seed("cuda", 0)
    assert seed is not None
    names = [p.name for p in seed.rglob("*") if p.is_file()]
    assert any(n.startswith("cuda_utils") for n in names), names
    assert any(n.startswith("__triton_launcher") for n in names), names
    assert "_warm_kernel.cubin" in names, names
    assert triton_seed("cpu", None) is None


def test_gpu_children_get_one_hardware_queue_unless_the_worker_says_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(spawn.CUDA_CONNECTIONS_ENV, raising=False)
    assert spawn._child_env("cuda", 0, tmp_path)[spawn.CUDA_CONNECTIONS_ENV] == "1"
    assert spawn.CUDA_CONNECTIONS_ENV not in spawn._child_env("cpu", None, tmp_path)
    monkeypatch.setenv(spawn.CUDA_CONNECTIONS_ENV, "8")
    assert spawn._child_env("cuda", 1, tmp_path)[spawn.CUDA_CONNECTIONS_ENV] == "8"


def test_a_childs_gpu_is_named_as_this_process_sees_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a scheduler's allocation (CUDA_VISIBLE_DEVICES=5,7) this process's GPU 1 is the
    host's GPU 7: a child pinned to "1" would time kernels on a GPU allocated to someone else."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5, 7")
    assert [spawn.visible_device(0), spawn.visible_device(1)] == ["5", "7"]
    with pytest.raises(ValueError, match="not one of CUDA_VISIBLE_DEVICES"):
        spawn.visible_device(2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f2c,GPU-11ab")
    assert spawn.visible_device(1) == "GPU-11ab"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert spawn.visible_device(3) == "3"


def test_children_keep_the_toolchain_the_worker_started_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's compiler sets TRITON_PTXAS_PATH in the process that compiles (the trusted
    reference's ``torch.compile``): a child started afterwards, or its compile companion, must
    not assemble with another ptxas than the children started before."""
    started = spawn._STARTED_ENV.get("TRITON_PTXAS_PATH")
    monkeypatch.setenv("TRITON_PTXAS_PATH", str(tmp_path / "bin" / "ptxas"))
    for env in (spawn._child_env("cuda", 0, tmp_path), spawn._companion_env(tmp_path)):
        assert env.get("TRITON_PTXAS_PATH") == started


def test_the_fork_server_hashes_triton_s_build_once_for_every_process_it_forks() -> None:
    """Triton computes the hash of its own build at a process's first compile (0.3 s of CPU)
    and caches it: computed by the fork server before it forks, it is cached in every child
    and compile companion, and a companion's first kernel no longer waits for it. A child says
    so through the only channel a solution has, its error (static checks off: the probe reads
    Triton's internals, which they refuse)."""
    root = Path(__file__).resolve().parents[2]
    task = load_task(root / "data" / "tasks" / "01_relu.py")
    probe = (
        "import torch.nn as nn\n"
        "from triton.runtime.cache import triton_key\n\n\n"
        "class ModelNew(nn.Module):\n"
        "    def forward(self, x):\n"
        "        raise RuntimeError(f'hashed: {triton_key.cache_info().currsize}')\n"
    )
    with Evaluator(EvalConfig(device="cpu", timeout_s=120, static_checks=False)) as evaluator:
        result = evaluator.evaluate(task, probe)
    assert result.status is Status.RUNTIME_ERROR and "hashed: 1" in result.error, result.error
