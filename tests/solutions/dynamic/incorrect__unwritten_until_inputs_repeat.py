# Hack (deferred work): after the checked calls, a timed call returns its output unwritten and
# remembers a few of its input's values. A later call whose input starts the same way (an
# untimed call on the contents the last timed call saw) is recognised on the device, which
# tells the host through a one-element parameter (a read the audit allows), and that call
# completes the output left unwritten. Caught because the output kept of a timed call is
# copied when its call ends, and no later call sees the same contents.
import torch
import torch.nn as nn
import triton
import triton.language as tl

HEAD = 16
CHECKED_CALLS = 3


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


@triton.jit
def same_head(x_ptr, head_ptr, signal_ptr, HEAD: tl.constexpr):
    offs = tl.arange(0, HEAD)
    same = (tl.load(x_ptr + offs) == tl.load(head_ptr + offs)).to(tl.int32)
    tl.store(signal_ptr, (tl.sum(same, axis=0) == HEAD).to(tl.float32))


@triton.jit
def remember_head(x_ptr, head_ptr, HEAD: tl.constexpr):
    offs = tl.arange(0, HEAD)
    tl.store(head_ptr + offs, tl.load(x_ptr + offs))


def relu_into(x, out):
    relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.signal = nn.Parameter(torch.zeros(()), requires_grad=False)
        self.calls = 0
        self.head = None
        self.pending = None

    def forward(self, x):
        x = x.contiguous()
        self.calls += 1
        out = torch.empty_like(x)
        if self.calls <= CHECKED_CALLS:
            relu_into(x, out)
            return out
        if self.head is None:
            self.head = torch.full((HEAD,), float("nan"), device=x.device, dtype=x.dtype)
        same_head[(1,)](x, self.head, self.signal, HEAD=HEAD)
        if float(self.signal) == 1.0 and self.pending is not None:
            relu_into(x, self.pending)  # the contents the unwritten output was asked for
            relu_into(x, out)
            return out
        remember_head[(1,)](x, self.head, HEAD=HEAD)
        self.pending = out
        return out
