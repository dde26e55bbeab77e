# GPU variant: the later call may be a spot audit or a call profiled after timing, or the next
# timed call, whose span (its end event) is then charged for the work of the call before it.
# Hack (deferred work): after the checked calls, a timed call copies its input aside and returns
# its output unwritten; the next call, timed or not, computes the output it left behind before
# its own. Every output is complete by the end of the run, none when its own call ends. (Copying
# costs as much as ReLU; for a matmul the copy is far cheaper than the product.) Caught because
# the output kept of a timed call is copied when its call ends.
import torch
import torch.nn as nn
import triton
import triton.language as tl

CHECKED_CALLS = 3


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


def relu_into(x, out):
    relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0
        self.pending = None

    def forward(self, x):
        x = x.contiguous()
        self.calls += 1
        out = torch.empty_like(x)
        if self.pending is not None:
            saved, left = self.pending
            relu_into(saved, left)  # the previous call's work, done now
            self.pending = None
        if self.calls <= CHECKED_CALLS:
            relu_into(x, out)
            return out
        self.pending = (x.clone(), out)
        relu_kernel[(1,)](x, out, 1, BLOCK=16)  # a launch on every call; one value written
        return out
