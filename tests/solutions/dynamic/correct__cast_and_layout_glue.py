# Legitimate: cast and layout glue around its own kernel (fp64 on a transposed copy, cast back):
# the copies move more than twice the call's bytes; they cost runtime, they are not the task.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


@triton.jit
def copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        staged = x.double().t().contiguous()
        out = torch.empty_like(staged)
        n = staged.numel()
        relu_kernel[(triton.cdiv(n, 1024),)](staged, out, n, BLOCK=1024)
        return out.t().float()
