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
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext

import torch

from kernelrl.env.sandbox.protocol import CHUNK_BYTES, recv_exactly_into

SLOTS = 2
RING_BYTES = SLOTS * CHUNK_BYTES
FILLED = b"\x01"  # child -> worker: the next slot holds the next chunk
FREED = b"\x02"  # worker -> child: the oldest filled slot may be written again
_RING = b"\x03"  # worker -> child, once: the ring's memfd rides on this byte
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class StreamError(RuntimeError):
    """The other side broke the stream's token order."""


class Ring:
    """Two ``CHUNK_BYTES`` slots of one shared memfd, mapped into this process."""

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


def send_ring(sock: socket.socket, ring: Ring) -> None:
    """Hand the ring's memfd to the child (before it may run anything but our code)."""
    socket.send_fds(sock, [_RING], [ring.fd])


def receive_ring(sock: socket.socket) -> Ring:
    """The child's side of ``send_ring``."""
    data, fds, _, _ = socket.recv_fds(sock, 1, 1)
    if data != _RING or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise StreamError("expected the output ring")
    return Ring(fds[0])


def send_tensor_bytes(sock: socket.socket, ring: Ring, tensor: torch.Tensor) -> None:
    """The raw bytes of ``tensor`` (any device, any layout; row-major order of the logical
    tensor, so the receiver needs only dtype and shape), chunk by chunk through the ring. Each
    slot is written again only once the worker has freed it, and the function returns once
    every slot is free, so that no token is left on the socket for the next message."""
    flat = tensor.detach().reshape(-1)
    step = max(CHUNK_BYTES // flat.element_size(), 1)
    filled = 0
    for number, start in enumerate(range(0, flat.numel(), step)):
        if filled == SLOTS:
            _await_freed(sock)
            filled -= 1
        piece = flat[start : start + step].contiguous().view(torch.uint8)
        ring.slots[number % SLOTS][: piece.numel()].copy_(piece)
        sock.sendall(FILLED)
        filled += 1
    for _ in range(filled):
        _await_freed(sock)


def _await_freed(sock: socket.socket) -> None:
    token = sock.recv(1)
    if token != FREED:
        raise ConnectionError("the worker broke the output stream")


def read_tensor_bytes(
    ring: Ring,
    nbytes: int,
    itemsize: int,
    buffer: torch.Tensor,
    receive: Callable[[memoryview], None],
    send: Callable[[bytes], None],
    guard: Callable[[], AbstractContextManager] = nullcontext,
) -> Iterator[torch.Tensor]:
    """The worker's side of ``send_tensor_bytes`` for one output of ``nbytes`` (from its
    validated description): yields each chunk as a view of ``buffer`` (this process's memory,
    host or device, at least ``CHUNK_BYTES``), reused for the next one. ``receive`` fills a
    one-byte view from the socket under the caller's watch (clock, memory); ``send`` writes a
    token; ``guard`` is held around each copy (a copy to the device is GPU work)."""
    step = CHUNK_BYTES - CHUNK_BYTES % itemsize
    token = bytearray(1)
    for number, start in enumerate(range(0, nbytes, step)):
        size = min(step, nbytes - start)
        receive(memoryview(token))
        if bytes(token) != FILLED:
            raise StreamError(f"expected a filled slot, got token {bytes(token)!r}")
        with guard():  # ours before anything reads it; complete when copy_ returns
            buffer[:size].copy_(ring.slots[number % SLOTS][:size])
        # Never blocks for long: one token per chunk of an output whose size the worker checked.
        send(FREED)
        yield buffer[:size]


def socket_reader(sock: socket.socket) -> Callable[[memoryview], None]:
    """``read_tensor_bytes``'s ``receive`` for a plain socket (no watch)."""
    return lambda view: recv_exactly_into(sock, view)
