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
        # Legitimate (if slow): 8 copies of the input around its own kernel cost runtime, not integrity;
        # ReLU is not data movement, so the copies cannot be the task.
        staged = x
        for _ in range(8):
            staged = staged.clone()
        out = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](staged, out, x.numel(), BLOCK=1024)
        return out
