"""The parent-child channel refuses anything but plain data."""

from __future__ import annotations

import io
import os
import pickle
import socket
import struct

import pytest
import torch

from kernelrl.env.sandbox.protocol import ProtocolError, recv_message, send_message


class Exploit:
    def __reduce__(self):
        return (os.system, ("touch /tmp/kernelrl-pwned",))


def test_round_trip_of_plain_data() -> None:
    a, b = socket.socketpair()
    message = {"type": "outputs", "launches": [1, 2], "t": torch.arange(3)}
    send_message(a, message)
    received = recv_message(b)
    assert received["launches"] == [1, 2] and torch.equal(received["t"], torch.arange(3))


def test_pickled_code_is_refused() -> None:
    a, b = socket.socketpair()
    buffer = io.BytesIO()
    torch.save({"type": "outputs", "x": Exploit()}, buffer, pickle_module=pickle)
    payload = buffer.getvalue()
    a.sendall(struct.pack("!Q", len(payload)) + payload)
    with pytest.raises(ProtocolError, match="undecodable"):
        recv_message(b)
    assert not os.path.exists("/tmp/kernelrl-pwned")


def test_oversized_and_typeless_messages_are_refused() -> None:
    a, b = socket.socketpair()
    a.sendall(struct.pack("!Q", 1 << 40))
    with pytest.raises(ProtocolError, match="exceeds"):
        recv_message(b)
    a, b = socket.socketpair()
    buffer = io.BytesIO()
    torch.save([1, 2, 3], buffer)
    a.sendall(struct.pack("!Q", len(buffer.getvalue())) + buffer.getvalue())
    with pytest.raises(ProtocolError, match="'type'"):
        recv_message(b)


def _streamed(output: torch.Tensor) -> list[torch.Tensor]:
    """``output``'s bytes sent through a real output ring and read back in the receiver's
    chunks."""
    import threading

    from kernelrl.env.sandbox.protocol import CHUNK_BYTES
    from kernelrl.env.sandbox.stream import (
        Ring,
        read_tensor_bytes,
        send_tensor_bytes,
        socket_reader,
    )

    left, right = socket.socketpair()
    ring = Ring.create()
    buffer = torch.empty(CHUNK_BYTES, dtype=torch.uint8)
    nbytes = output.numel() * output.element_size()
    try:
        sender = threading.Thread(target=send_tensor_bytes, args=(left, ring, output))
        sender.start()
        chunks = read_tensor_bytes(
            ring, nbytes, output.element_size(), buffer, socket_reader(right), right.sendall
        )
        received = torch.cat([chunk.clone() for chunk in chunks]) if nbytes else buffer[:0]
        sender.join()
    finally:
        left.close()
        right.close()
        ring.close()
    flat = received.view(output.dtype)
    return [flat[i : i + 1000] for i in range(0, flat.numel(), 1000)]  # uneven last chunk


def _compare(expected: torch.Tensor, output: torch.Tensor):
    from kernelrl.env.compare import OutputMatcher, describe_outputs
    from kernelrl.env.task import task_from_source

    task = task_from_source(
        "class Model: ...\ndef get_inputs(): ...\ndef get_init_inputs(): ...\n", "t"
    )
    matcher = OutputMatcher(task, [expected], 0)
    matcher.check_description(describe_outputs([output]))
    for chunk in _streamed(output):
        matcher.add_chunk(0, chunk)
    return matcher.finish()


def test_streamed_outputs_are_compared_chunk_by_chunk() -> None:
    expected = torch.randn(3, 1501, dtype=torch.float32)
    same = _compare(expected, expected.t().contiguous().t())  # a non-contiguous layout
    assert same.correct and same.max_abs_err == 0.0
    assert same.ref_scale == pytest.approx(float(expected.abs().max()))

    wrong = expected.clone()
    wrong[2, 7] += 1.0  # in the last chunks only
    wrong[2, 9] += 3.0
    result = _compare(expected, wrong)
    assert not result.correct
    assert "2/4503 values outside" in result.problems[0]
    assert "first at index [2, 7]" in result.problems[0]
    assert f"expected {float(expected[2, 7]):.6g}" in result.problems[0]
    assert result.max_abs_err == pytest.approx(3.0, rel=1e-5)

    nan = expected.clone()
    nan[0, 0] = float("nan")
    assert "1 NaN/Inf values" in _compare(expected, nan).problems[0]
