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
