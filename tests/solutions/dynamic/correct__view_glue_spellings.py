# Legitimate: the kernel's input and output reshaped with the other spellings of a view
# (ravel, mT, reshape_as, concat of views): glue, not compute, at run time as statically.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        flat = x.mT.mT.contiguous().ravel()
        halves = torch.concat([flat[: flat.numel() // 2], flat[flat.numel() // 2 :]])
        out = torch.empty_like(halves)
        n = halves.numel()
        relu_kernel[(triton.cdiv(n, 1024),)](halves, out, n, BLOCK=1024)
        return out.reshape_as(x)
