"""Messages between the trusted worker and the sandboxed child.

The channel is a private socket pair, never stdout/stderr, so nothing a solution prints can be
taken for a message. Tensors never travel inside a message: a message describes them (dtype,
shape, size) and their bytes follow through the output ring (``stream``), in bounded chunks, so a
16 GiB output costs the receiver one chunk of host memory at a time, not a pickle of the whole
tensor. Everything the worker reads from the child is decoded with
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


def recv_exactly_into(sock: socket.socket, buffer: memoryview) -> None:
    """Fill ``buffer`` from the socket; EOFError when the peer closes first."""
    view, filled = buffer, 0
    while filled < len(view):
        received = sock.recv_into(view[filled:], min(len(view) - filled, 1 << 22))
        if not received:
            raise EOFError("peer closed the channel")
        filled += received
