"""The output ring: bytes arrive whole and in order, the worker's mapping cannot be made to
fault, and neither side runs ahead of the other's tokens."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time

import pytest
import torch

from kernelrl.env.sandbox.protocol import CHUNK_BYTES
from kernelrl.env.sandbox.stream import (
    FILLED,
    RING_BYTES,
    Ring,
    StreamError,
    read_tensor_bytes,
    receive_rings,
    send_rings,
    send_tensor_bytes,
    socket_reader,
)


@pytest.fixture
def channel():
    left, right = socket.socketpair()
    ring = Ring.create()
    yield left, right, ring
    left.close()
    right.close()
    ring.close()


def test_a_tensor_of_more_chunks_than_slots_arrives_whole_and_in_order(channel) -> None:
    left, right, ring = channel
    rows = CHUNK_BYTES * 5 // 2 // 4 // 1024  # two and a half chunks of float32
    output = torch.randn(1024, rows).t()  # not contiguous: sent in row-major order of the view
    sender = threading.Thread(target=send_tensor_bytes, args=(left, ring, output))
    sender.start()
    buffer = torch.empty(CHUNK_BYTES, dtype=torch.uint8)
    nbytes = output.numel() * 4
    chunks = [
        c.clone()
        for c in read_tensor_bytes(ring, nbytes, 4, buffer, socket_reader(right), right.sendall)
    ]
    sender.join(timeout=60)
    assert len(chunks) == 3 and not sender.is_alive()
    assert torch.equal(torch.cat(chunks).view(torch.float32), output.reshape(-1))
    right.setblocking(False)
    with pytest.raises(BlockingIOError):  # no token left behind for the next message
        right.recv(1)


def test_a_chunk_is_copied_and_looked_at_in_one_turn_of_the_guard_never_held_waiting(
    channel,
) -> None:
    """The worker's lock on its GPU work is taken once a chunk for its copy and what the caller
    computes on it (each turn may wait behind a measurement), and never held while the worker
    waits for the child or writes it a token (a child that reads none could block that write)."""
    left, right, ring = channel
    output = torch.randn(CHUNK_BYTES * 5 // 8)  # two and a half chunks
    sender = threading.Thread(target=send_tensor_bytes, args=(left, ring, output))
    sender.start()
    buffer = torch.empty(CHUNK_BYTES, dtype=torch.uint8)
    lock, turns, seen = threading.Lock(), [], []

    def guard():
        turns.append(lock.locked())  # never asked for while it is held
        return lock

    def receive(view: memoryview) -> None:
        seen.append(("wait", lock.locked()))
        socket_reader(right)(view)

    def send(token: bytes) -> None:
        seen.append(("free", lock.locked()))
        right.sendall(token)

    chunks = read_tensor_bytes(ring, output.numel() * 4, 4, buffer, receive, send, guard)
    for _ in chunks:
        seen.append(("chunk", lock.locked()))
    sender.join(timeout=60)
    assert turns == [False] * 3
    assert seen == [("wait", False), ("chunk", True), ("free", False)] * 3
    assert not lock.locked()


def test_the_sender_waits_for_a_freed_slot_before_writing_it_again(channel) -> None:
    left, right, ring = channel
    output = torch.zeros(CHUNK_BYTES * 3 // 4, dtype=torch.float32)  # three chunks
    stopped: list[BaseException] = []

    def send() -> None:
        try:
            send_tensor_bytes(left, ring, output)
        except ConnectionError as exc:
            stopped.append(exc)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    time.sleep(0.5)
    right.setblocking(False)
    assert right.recv(8) == FILLED * 2 and sender.is_alive()  # both slots full, then it waits
    ring.slots[0].fill_(7)  # the worker's copy of slot 0 not freed yet: nothing overwrites it
    time.sleep(0.2)
    assert int(ring.slots[0][0]) == 7
    right.close()  # the worker hangs up: the sender stops instead of writing on
    sender.join(timeout=10)
    assert not sender.is_alive() and stopped


def test_the_ring_cannot_be_resized_under_the_workers_mapping(channel) -> None:
    _, _, ring = channel
    for size in (0, RING_BYTES // 2, RING_BYTES * 2):
        with pytest.raises(PermissionError):
            os.ftruncate(ring.fd, size)
    assert os.fstat(ring.fd).st_size == RING_BYTES
    assert int(ring.slots[-1][-1]) == 0  # the mapping's last byte still reads


def test_the_child_side_takes_only_a_ring_of_the_agreed_size() -> None:
    left, right = socket.socketpair()
    try:
        fd = os.memfd_create("not-a-ring")
        os.ftruncate(fd, 4096)
        socket.send_fds(left, [b"\x03"], [fd])
        os.close(fd)
        with pytest.raises(StreamError, match="not"):
            receive_rings(right)
        ring = Ring.create()
        send_rings(left, ring, None, 0)
        received, offered = receive_rings(right)
        assert offered is None
        received.slots[1][:3] = torch.tensor([1, 2, 3], dtype=torch.uint8)
        assert ring.slots[1][:3].tolist() == [1, 2, 3]  # one memory, both mappings
        received.close()
        ring.close()
    finally:
        left.close()
        right.close()


def test_a_device_ring_s_descriptor_and_size_ride_with_the_host_ring(channel) -> None:
    """The handover's framing (the device ring's own mapping needs a GPU: test_device_ring.py):
    the second descriptor arrives with its size, and a second descriptor without one, or a
    size without a descriptor, is a broken handover whose descriptors are closed."""
    left, right, ring = channel
    stand_in = os.memfd_create("device-ring-descriptor")
    try:
        send_rings(left, ring, stand_in, 64 << 20)
        received, (fd, size) = receive_rings(right)
        assert size == 64 << 20 and os.fstat(fd).st_ino == os.fstat(stand_in).st_ino
        os.close(fd)
        received.close()
        ours = _descriptors_of(ring.fd), _descriptors_of(stand_in)  # mmap holds a copy
        for data, fds in ((b"\x03", [ring.fd, stand_in]), (b"\x03" + bytes(8), [ring.fd])):
            socket.send_fds(left, [data], fds)
            with pytest.raises(StreamError, match="expected the output ring"):
                receive_rings(right)
            assert (_descriptors_of(ring.fd), _descriptors_of(stand_in)) == ours
    finally:
        os.close(stand_in)


def _descriptors_of(fd: int) -> int:
    """How many of this process's descriptors open the file ``fd`` opens."""
    inode, count = os.fstat(fd).st_ino, 0
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile (the listing's own, say)
            count += os.stat(f"/proc/self/fd/{name}").st_ino == inode
    return count


def test_a_token_out_of_order_is_a_broken_stream(channel) -> None:
    left, right, ring = channel
    left.sendall(b"\x09")
    buffer = torch.empty(CHUNK_BYTES, dtype=torch.uint8)
    with pytest.raises(StreamError, match="filled slot"):
        list(read_tensor_bytes(ring, 16, 4, buffer, socket_reader(right), right.sendall))


@pytest.mark.gpu
def test_a_device_tensor_goes_through_page_locked_slots(channel) -> None:
    """On a GPU the child copies each chunk from the device straight into the slots, which it
    has page-locked in its CUDA context."""
    left, right, ring = channel
    output = torch.randn(CHUNK_BYTES * 3 // 8, device="cuda")  # one and a half chunks
    ring.page_lock()
    assert ring._registered
    sender = threading.Thread(target=send_tensor_bytes, args=(left, ring, output))
    sender.start()
    buffer = torch.empty(CHUNK_BYTES, dtype=torch.uint8)
    nbytes = output.numel() * 4
    reader = socket_reader(right)
    chunks = [c.clone() for c in read_tensor_bytes(ring, nbytes, 4, buffer, reader, right.sendall)]
    sender.join(timeout=60)
    assert torch.equal(torch.cat(chunks).view(torch.float32), output.cpu())
    ring.close()
    assert not ring.slots


@pytest.mark.gpu
def test_the_worker_copies_chunks_from_the_ring_to_the_device_under_its_guard(channel) -> None:
    """The evaluator's path on a GPU: each chunk copied from the slot straight to device
    memory of the worker's own, the copy held under the guard (its lock on trusted GPU work)."""
    left, right, ring = channel
    output = torch.randn(CHUNK_BYTES * 5 // 8, device="cuda")  # two and a half chunks
    sender = threading.Thread(target=send_tensor_bytes, args=(left, ring, output))
    sender.start()
    ring.page_lock()  # the worker's context too (the child's in a real evaluation)
    buffer = torch.empty(CHUNK_BYTES, dtype=torch.uint8, device="cuda")
    lock, held = threading.Lock(), []

    def guard():
        held.append(True)
        return lock

    reader = socket_reader(right)
    chunks = read_tensor_bytes(ring, output.numel() * 4, 4, buffer, reader, right.sendall, guard)
    received = torch.cat([c.clone() for c in chunks])
    sender.join(timeout=60)
    assert received.device.type == "cuda" and len(held) == 3
    assert torch.equal(received.view(torch.float32), output)


def test_where_no_device_ring_can_be_made_the_offer_says_why_and_raises_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kernelrl.env.sandbox import device_ring

    assert device_ring.offer("cpu", None) == (None, "not a GPU evaluation")
    monkeypatch.setenv(device_ring.MODE_ENV, "host")
    assert device_ring.offer("cuda", 0) == (None, "KERNELRL_OUTPUT_RING=host")
    monkeypatch.delenv(device_ring.MODE_ENV)
    if not torch.cuda.is_available():  # no driver here: refused, with the reason
        ring, why = device_ring.offer("cuda", 0)
        assert ring is None and why
