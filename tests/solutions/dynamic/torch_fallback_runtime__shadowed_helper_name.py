# The static check types `ops` as the solution's own helper (it is bound to _Ops() once), but
# forward rebinds it to the input tensor: ops.clamp_min is torch compute the AST cannot see.
# Only the runtime op audit can catch it.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


class _Ops:
    def clamp_min(self, x, value):
        return x


ops = _Ops()


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        ops = out
        return ops.clamp_min(0.0)
