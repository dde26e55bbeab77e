"""The output ring in GPU memory: bytes arrive whole through device-to-device copies, the
worker reads only its own copy, and nothing the child does to its mapping reaches the worker's."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest
import torch

from kernelrl.env.sandbox.device_ring import SLOT_BYTES, DeviceRing
from kernelrl.env.sandbox.protocol import CHUNK_BYTES
from kernelrl.env.sandbox.stream import (
    FILLED,
    FREED,
    read_tensor_bytes,
    send_tensor_bytes,
    socket_reader,
)

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
DEVICE = torch.device("cuda", 0)


@pytest.fixture
def rings():
    """The worker's ring and a second mapping of it through its exported descriptor: what a
    child maps (here in this process, at another address)."""
    left, right = socket.socketpair()
    worker = DeviceRing.create(DEVICE)
    child = DeviceRing.attach(worker.export(), worker.size, DEVICE)
    yield left, right, worker, child
    left.close()
    right.close()
    child.close()
    worker.close()


def test_two_mappings_are_one_memory(rings) -> None:
    _, _, worker, child = rings
    assert child.slots[1].data_ptr() != worker.slots[1].data_ptr()
    child.slots[1][:4] = torch.tensor([1, 2, 3, 4], dtype=torch.uint8, device=DEVICE)
    torch.cuda.synchronize()
    assert worker.slots[1][:4].tolist() == [1, 2, 3, 4]


def test_a_new_ring_holds_nothing_the_worker_left_in_memory_it_freed() -> None:
    """The worker's freed memory (say, a task's expected outputs) can come back from the driver
    as it was: the ring is zeroed before any child maps it."""
    for _ in range(3):
        left_behind = torch.full((1 << 30,), 0x5A, dtype=torch.uint8, device=DEVICE)
        del left_behind
        torch.cuda.empty_cache()
        worker = DeviceRing.create(DEVICE)
        child = DeviceRing.attach(worker.export(), worker.size, DEVICE)
        try:
            assert int(child.mapping.count_nonzero()) == 0
        finally:
            child.close()
            worker.close()


def test_an_output_of_many_slots_arrives_whole_on_the_device(rings) -> None:
    left, right, worker, child = rings
    output = torch.randn(1024, SLOT_BYTES * 5 // 2 // 4 // 1024, device=DEVICE).t()
    sender = threading.Thread(target=send_tensor_bytes, args=(left, child, output))
    sender.start()
    buffer = torch.empty(CHUNK_BYTES, dtype=torch.uint8, device=DEVICE)
    reader = socket_reader(right)
    nbytes = output.numel() * 4
    chunks = [
        c.clone() for c in read_tensor_bytes(worker, nbytes, 4, buffer, reader, right.sendall)
    ]
    sender.join(timeout=60)
    assert len(chunks) == 3 and all(c.is_cuda for c in chunks)
    assert torch.equal(torch.cat(chunks).view(torch.float32), output.reshape(-1))


def test_a_slot_rewritten_after_its_token_changes_nothing_the_worker_reads(rings) -> None:
    """A child that rewrites the slot once it has said FILLED (here: at once, before the worker
    looks) changes what it claims, never memory the worker compares: the chunk handed on is
    the worker's copy, and a rewrite after that copy leaves it as it was. The slot is freed
    once the worker is done with its chunk, not before."""
    left, right, worker, child = rings
    left.settimeout(30)  # a free that never comes fails the test rather than hanging it
    child.slots[0][:8] = torch.arange(8, dtype=torch.uint8, device=DEVICE)
    torch.cuda.synchronize()
    left.sendall(FILLED)
    buffer = torch.empty(CHUNK_BYTES, dtype=torch.uint8, device=DEVICE)
    chunks = read_tensor_bytes(worker, 8, 1, buffer, socket_reader(right), right.sendall)
    chunk = next(chunks)
    left.setblocking(False)
    with pytest.raises(BlockingIOError):  # still the worker's: not freed while it compares
        left.recv(1)
    left.settimeout(30)
    child.slots[0][:8] = 255
    torch.cuda.synchronize()
    assert chunk.tolist() == list(range(8))
    assert next(chunks, None) is None  # the worker done with its only chunk
    assert left.recv(1) == FREED


def test_the_child_unmapping_its_view_leaves_the_worker_s_mapping_whole() -> None:
    worker = DeviceRing.create(DEVICE)
    try:
        child = DeviceRing.attach(worker.export(), worker.size, DEVICE)
        child.slots[0][:2] = 7
        torch.cuda.synchronize()
        child.close()
        assert worker.slots[0][:2].tolist() == [7, 7]
        worker.slots[1].fill_(1)
        torch.cuda.synchronize()
        assert int(worker.slots[1].sum()) == SLOT_BYTES
    finally:
        worker.close()


def test_rings_closed_on_another_thread_give_their_memory_back() -> None:
    """The worker's gate makes rings on one thread and its reaper frees them on another: a
    hundred rings (6.4 GB) come and go without the device's free memory moving by one."""
    torch.cuda.synchronize()
    free_before, _ = torch.cuda.mem_get_info(DEVICE)
    rings = [DeviceRing.create(DEVICE) for _ in range(100)]
    assert torch.cuda.mem_get_info(DEVICE)[0] < free_before - 99 * 2 * SLOT_BYTES
    closer = threading.Thread(target=lambda: [ring.close() for ring in rings])
    closer.start()
    closer.join(timeout=60)
    assert torch.cuda.mem_get_info(DEVICE)[0] > free_before - 2 * SLOT_BYTES


def test_a_size_under_two_slots_is_refused_before_mapping() -> None:
    from kernelrl.env.sandbox.device_ring import DeviceRingUnavailable

    worker = DeviceRing.create(DEVICE)
    try:
        with pytest.raises(DeviceRingUnavailable, match="under 2 slots"):
            DeviceRing.attach(worker.export(), SLOT_BYTES, DEVICE)
    finally:
        worker.close()


@pytest.mark.parametrize("mode", ["", "host"])
def test_an_evaluation_compares_through_the_ring_it_reports(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end on the bundled ReLU (a 132 MB output: five device slots): the same verdict
    through either ring, and the evaluation says which one carried the bytes."""
    from kernelrl.env.evaluator import EvalConfig, Evaluator
    from kernelrl.env.result import Status
    from kernelrl.env.task import load_task

    monkeypatch.setenv("KERNELRL_OUTPUT_RING", mode)
    task = load_task(ROOT / "data" / "tasks" / "01_relu.py")
    good = (ROOT / "data" / "solutions" / "triton" / "01_relu.py").read_text()
    wrong = good.replace("tl.maximum(x, 0.0)", "tl.maximum(x, 0.0) + 1.0")
    assert wrong != good
    evaluator = Evaluator(EvalConfig(device="cuda"))
    try:
        right_result = evaluator.evaluate(task, good)
        wrong_result = evaluator.evaluate(task, wrong)
    finally:
        evaluator.close()
    expected = "host" if mode == "host" else "device"
    assert right_result.status is Status.CORRECT, right_result.feedback
    assert wrong_result.status is Status.INCORRECT, wrong_result.feedback
    assert right_result.sandbox["output_ring"] == expected, right_result.sandbox
    assert wrong_result.sandbox["output_ring"] == expected


# Hack: unmap the child's view of the worker's device ring and release its handle, leaving the
# harness's slot views pointing at nothing, in the hope that the worker's copy out of the ring
# faults (a sticky error in the trusted worker's CUDA context would fail every later evaluation
# on it). The kernel itself is honest Triton, so the only thing wrong with it is the unmapping;
# where the unmapping cannot be done the solution says so, and the test fails rather than pass
# on an evaluation that never touched the ring.
UNMAPS_ITS_RING_PREFIX = """
import gc

from cuda.bindings import driver

_rings = [o for o in gc.get_objects() if type(o).__name__ == "DeviceRing"]
if not _rings:
    raise RuntimeError("HACK_FOUND_NO_RING")
for _ring in _rings:
    for _step in (
        driver.cuMemUnmap(_ring._address, _ring.size),
        driver.cuMemRelease(_ring._handle),
    ):
        if _step[0] != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"HACK_COULD_NOT_UNMAP {_step[0]}")
"""


def test_a_solution_that_unmaps_its_ring_faults_only_itself() -> None:
    """The child's copy into its unmapped view faults in the child; the worker, which maps its
    own allocation, judges the next evaluation as ever."""
    from kernelrl.env.evaluator import EvalConfig, Evaluator
    from kernelrl.env.result import Status
    from kernelrl.env.task import load_task

    task = load_task(ROOT / "data" / "tasks" / "01_relu.py")
    good = (ROOT / "data" / "solutions" / "triton" / "01_relu.py").read_text()
    evaluator = Evaluator(EvalConfig(device="cuda", static_checks=False))
    try:
        hack = evaluator.evaluate(task, UNMAPS_ITS_RING_PREFIX + good)
        after = evaluator.evaluate(task, good)
    finally:
        evaluator.close()
    assert hack.sandbox["output_ring"] == "device"
    assert hack.status is Status.RUNTIME_ERROR, (hack.status, hack.feedback)
    assert "HACK_" not in hack.feedback, hack.feedback
    assert after.status is Status.CORRECT, after.feedback
