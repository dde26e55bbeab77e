"""Messages between the trusted worker and the sandboxed child.

The channel is a private socket pair, never stdout/stderr, so nothing a solution prints can be
taken for a message. Tensors never travel inside a message: a message describes them (dtype,
shape, size) and their bytes follow raw, in bounded chunks, so a 16 GiB output costs the receiver
one chunk of host memory at a time, not a pickle of the whole tensor. Everything the worker reads from the child is decoded with
``torch.load(weights_only=True)``, the unpickler built for untrusted files: a child can lie
about its own outputs, but it cannot make the worker execute anything. The worker never takes
a verdict from the child: it compares outputs itself against references the child never sees.
"""

from __future__ import annotations

import io
import socket
import struct
from typing import Any

import torch

# Module names the sandbox gives the solution and the task it loads.
SOLUTION_MODULE = "kernelrl_solution"
TASK_MODULE = "kernelrl_task"

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
CHUNK_BYTES = 64 * 1024 * 1024  # host memory one side of a tensor stream holds at a time
_HEADER = struct.Struct("!Q")


class ProtocolError(RuntimeError):
    """The other side sent something that is not a well-formed message."""


def send_message(sock: socket.socket, message: dict[str, Any]) -> None:
    buffer = io.BytesIO()
    torch.save(message, buffer)
    payload = buffer.getvalue()
    sock.sendall(_HEADER.pack(len(payload)) + payload)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise EOFError("peer closed the channel")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv_message(sock: socket.socket) -> dict[str, Any]:
    (size,) = _HEADER.unpack(_recv_exactly(sock, _HEADER.size))
    if size > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {size} bytes exceeds the {MAX_MESSAGE_BYTES} byte limit")
    payload = _recv_exactly(sock, size)
    try:
        message = torch.load(io.BytesIO(payload), weights_only=True)
    except Exception as exc:  # any decoding failure means a malformed or hostile message
        raise ProtocolError(f"undecodable message: {type(exc).__name__}: {exc}") from exc
    if not isinstance(message, dict) or "type" not in message:
        raise ProtocolError("message is not a dict with a 'type'")
    return message


def send_tensor_bytes(sock: socket.socket, tensor: torch.Tensor) -> None:
    """The raw bytes of ``tensor`` (any device, any layout), in chunks of ``CHUNK_BYTES``.

    Row-major order of the logical tensor, so the receiver needs only dtype and shape. A GPU
    tensor goes through two pinned host buffers: the device copies the next chunk while this
    one is on the socket.
    """
    flat = tensor.detach().reshape(-1)
    if flat.numel() == 0:
        return
    step = max(CHUNK_BYTES // flat.element_size(), 1)
    if flat.device.type != "cuda":
        for start in range(0, flat.numel(), step):
            chunk = flat[start : start + step].contiguous().view(torch.uint8).cpu()
            sock.sendall(memoryview(chunk.numpy()))
        return
    buffers, copied = _pinned_buffers(), [torch.cuda.Event(), torch.cuda.Event()]
    sizes = [0, 0]

    def copy_chunk(slot: int, start: int) -> None:
        piece = flat[start : start + step].contiguous().view(torch.uint8)
        sizes[slot] = piece.numel()
        buffers[slot][: sizes[slot]].copy_(piece, non_blocking=True)
        copied[slot].record()

    copy_chunk(0, 0)
    for number, start in enumerate(range(0, flat.numel(), step)):
        slot = number % 2
        if start + step < flat.numel():  # the other buffer was sent in the previous round
            copy_chunk(1 - slot, start + step)
        copied[slot].synchronize()
        sock.sendall(memoryview(buffers[slot].numpy())[: sizes[slot]])


_PINNED: list[torch.Tensor] = []


def _pinned_buffers() -> list[torch.Tensor]:
    """Two page-locked chunk buffers, made once per process (allocating them costs more than
    copying a chunk)."""
    if not _PINNED:
        try:
            _PINNED.extend(
                torch.empty(CHUNK_BYTES, dtype=torch.uint8, pin_memory=True) for _ in "ab"
            )
        except RuntimeError:  # no page-locked memory left: pageable buffers, copied in turn
            _PINNED[:] = [torch.empty(CHUNK_BYTES, dtype=torch.uint8) for _ in "ab"]
    return _PINNED


def recv_exactly_into(sock: socket.socket, buffer: memoryview) -> None:
    """Fill ``buffer`` from the socket; EOFError when the peer closes first."""
    view, filled = buffer, 0
    while filled < len(view):
        received = sock.recv_into(view[filled:], min(len(view) - filled, 1 << 22))
        if not received:
            raise EOFError("peer closed the channel")
        filled += received
