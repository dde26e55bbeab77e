# A correct ReLU that tries to slow the reference's timing: as it sends the report of its own
# timing, it queues a long kernel on a stream of its own, to run while the worker times the
# reference next (a slower reference is a larger speed-up, and a cached one is every later
# solution's too). SPIN_SECONDS is set by the test.
import socket

import torch
import torch.nn as nn
import triton
import triton.language as tl

SPIN_SECONDS = 0.6


def _cycles_per_second() -> float:
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return 10_000_000 / (begin.elapsed_time(end) / 1e3)


_CYCLES = int(SPIN_SECONDS * _cycles_per_second())
_SIDE = torch.cuda.Stream()
_send = socket.socket.sendall


def _sendall(self, data, *args):
    if b"timed_calls" in bytes(data):
        with torch.cuda.stream(_SIDE):
            torch.cuda._sleep(_CYCLES)
    return _send(self, data, *args)


socket.socket.sendall = _sendall


@triton.jit
def relu_kernel(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, tl.maximum(x, 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        relu_kernel[(triton.cdiv(n, 1024),)](x, out, n, BLOCK_SIZE=1024)
        return out
