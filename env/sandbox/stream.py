"""The bytes of a call's tensor outputs, from the sandboxed child to the worker, through a ring
of two shared slots.

Messages travel on the socket pair (``protocol``); the bytes of an output do not. Through the
socket every byte was copied twice by the kernel, at 1.5-5 GB/s on the hosts we measured, which
made comparing the outputs of KernelBench's published sizes (6.4 GB for one ``19_ReLU`` output)
the largest part of an evaluation. Through the ring the child copies each chunk once into a
slot (straight from the device where the slot is page-locked) and the worker copies it once
into memory of its own; the socket carries one token per chunk each way.

What keeps the trusted side trusted:
- The worker makes the ring: a memfd of exactly ``RING_BYTES``, sealed against growing and
  shrinking before the child gets it, so that no child can truncate it under the worker's
  mapping (a fault there would kill the worker, not the child).
- The worker copies a slot into its own buffer before it looks at any byte, and only then frees
  the slot: a child that rewrites a slot while it is read changes nothing but what it claims,
  which a child can always lie about; what is compared is never memory the child can write.
- The number and size of the chunks come from the output description the worker has already
  validated, never from the stream; a token other than ``FILLED`` is a malformed stream.

On a GPU the same stream runs through a ring in device memory (``device_ring``), offered with
this one at the gate: the tokens, the order and the worker's copy-before-read are the same.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Protocol

import torch

from kernelrl.env.sandbox.protocol import CHUNK_BYTES, recv_exactly_into

SLOTS = 2
RING_BYTES = SLOTS * CHUNK_BYTES
FILLED = b"\x01"  # child -> worker: the next slot holds the next chunk
FREED = b"\x02"  # worker -> child: the oldest filled slot may be written again
_RING = b"\x03"  # worker -> child, once: the rings' descriptors ride on this byte
_SIZE_BYTES = 8  # after _RING when a device ring follows: its size
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class StreamError(RuntimeError):
    """The other side broke the stream's token order."""


class OutputRing(Protocol):
    """What the stream needs of a ring: this host ring or the device ring (``device_ring``)."""

    slots: list[torch.Tensor]
    slot_bytes: int
    on_device: bool


class Ring:
    """Two ``CHUNK_BYTES`` slots of one shared memfd, mapped into this process."""

    on_device = False
    slot_bytes = CHUNK_BYTES

    def __init__(self, fd: int) -> None:
        if os.fstat(fd).st_size != RING_BYTES:
            raise StreamError(f"ring is {os.fstat(fd).st_size} bytes, not {RING_BYTES}")
        self.fd = fd
        self._map = mmap.mmap(fd, RING_BYTES, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        whole = torch.frombuffer(self._map, dtype=torch.uint8)
        self.slots = [whole[i * CHUNK_BYTES : (i + 1) * CHUNK_BYTES] for i in range(SLOTS)]
        self._registered = False

    @classmethod
    def create(cls) -> Ring:
        """A new ring, sized and sealed (the worker's side)."""
        fd = os.memfd_create("kernelrl-outputs", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, RING_BYTES)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            return cls(fd)
        except BaseException:
            os.close(fd)
            raise

    def page_lock(self) -> None:
        """Make the slots page-locked for this process's CUDA context, so that copies between
        them and the device are direct (the child's copies in, the worker's copies out);
        pageable slots still work."""
        if self._registered or not torch.cuda.is_initialized():
            return
        address = self.slots[0].data_ptr()
        try:
            self._registered = torch.cuda.cudart().cudaHostRegister(address, RING_BYTES, 0) == 0
        except Exception:  # noqa: BLE001 - no such call in this build: pageable slots
            self._registered = False

    def close(self) -> None:
        if self._registered:
            self._registered = False
            with contextlib.suppress(Exception):
                torch.cuda.cudart().cudaHostUnregister(self.slots[0].data_ptr())
        self.slots = []
        with contextlib.suppress(BufferError):  # a view still alive: the mapping goes with it
            self._map.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)


def send_rings(sock: socket.socket, ring: Ring, device_fd: int | None, device_size: int) -> None:
    """Hand the host ring's memfd to the child (before it may run anything but our code), and
    with ``device_fd`` a device ring's descriptor and size (``device_ring.DeviceRing.export``)."""
    if device_fd is None:
        socket.send_fds(sock, [_RING], [ring.fd])
    else:
        socket.send_fds(
            sock, [_RING + device_size.to_bytes(_SIZE_BYTES, "little")], [ring.fd, device_fd]
        )


def receive_rings(sock: socket.socket) -> tuple[Ring, tuple[int, int] | None]:
    """The child's side of ``send_rings``: the host ring, and the device ring's descriptor and
    size where one was offered (the child maps it once it has a CUDA context)."""
    data, fds, _, _ = socket.recv_fds(sock, 1 + _SIZE_BYTES, 2)
    offered = len(data) == 1 + _SIZE_BYTES and len(fds) == 2
    if data[:1] != _RING or not (offered or (len(data) == 1 and len(fds) == 1)):
        for fd in fds:
            os.close(fd)
        raise StreamError("expected the output ring")
    device = (fds[1], int.from_bytes(data[1:], "little")) if offered else None
    return Ring(fds[0]), device


def send_tensor_bytes(sock: socket.socket, ring: OutputRing, tensor: torch.Tensor) -> None:
    """The raw bytes of ``tensor`` (any device, any layout; row-major order of the logical
    tensor, so the receiver needs only dtype and shape), chunk by chunk through the ring. Each
    slot is written again only once the worker has freed it, and the function returns once
    every slot is free, so that no token is left on the socket for the next message."""
    flat = tensor.detach().reshape(-1)
    step = max(ring.slot_bytes // flat.element_size(), 1)
    filled = 0
    for number, start in enumerate(range(0, flat.numel(), step)):
        if filled == SLOTS:
            _await_freed(sock)
            filled -= 1
        piece = flat[start : start + step].contiguous().view(torch.uint8)
        slot = ring.slots[number % SLOTS]
        slot[: piece.numel()].copy_(piece)
        if ring.on_device:  # a device-to-device copy returns before it is done
            torch.cuda.current_stream(slot.device).synchronize()
        sock.sendall(FILLED)
        filled += 1
    for _ in range(filled):
        _await_freed(sock)


def _await_freed(sock: socket.socket) -> None:
    token = sock.recv(1)
    if token != FREED:
        raise ConnectionError("the worker broke the output stream")


def read_tensor_bytes(
    ring: OutputRing,
    nbytes: int,
    itemsize: int,
    buffer: torch.Tensor,
    receive: Callable[[memoryview], None],
    send: Callable[[bytes], None],
    guard: Callable[[], AbstractContextManager] = nullcontext,
) -> Iterator[torch.Tensor]:
    """The worker's side of ``send_tensor_bytes`` for one output of ``nbytes`` (from its
    validated description): yields each chunk as a view of ``buffer`` (this process's memory,
    host or device, at least ``ring.slot_bytes``), reused for the next one. ``receive`` fills a
    one-byte view from the socket under the caller's watch (clock, memory); ``send`` writes a
    token; ``guard`` is held around each copy and while the caller has the chunk (a copy to the
    device and what the caller computes on it are GPU work: one turn of the guard for both),
    never while waiting for the child or writing to it: the slot is freed once the caller is
    done with the chunk (the child fills the other slot meanwhile). A caller that stops early
    must ``close()`` this."""
    step = ring.slot_bytes - ring.slot_bytes % itemsize
    token = bytearray(1)
    for number, start in enumerate(range(0, nbytes, step)):
        size = min(step, nbytes - start)
        receive(memoryview(token))
        if bytes(token) != FILLED:
            raise StreamError(f"expected a filled slot, got token {bytes(token)!r}")
        with guard():  # ours before anything reads it, and complete before the slot is freed
            buffer[:size].copy_(ring.slots[number % SLOTS][:size])
            if ring.on_device and buffer.is_cuda:  # the one copy that returns before it is done
                torch.cuda.current_stream(buffer.device).synchronize()
            yield buffer[:size]
        # After the guard: a child that reads no tokens could make this wait, never the guard.
        send(FREED)


def socket_reader(sock: socket.socket) -> Callable[[memoryview], None]:
    """``read_tensor_bytes``'s ``receive`` for a plain socket (no watch)."""
    return lambda view: recv_exactly_into(sock, view)
