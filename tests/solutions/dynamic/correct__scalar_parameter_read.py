# Legitimate: a scalar parameter (as in KernelBench's nn.Parameter(torch.tensor(c))) read into
# Python once per call and handed to the kernel.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def scale_relu(x_ptr, out_ptr, n, c, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.maximum(x * c, 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(1.0))

    def forward(self, x):
        out = torch.empty_like(x)
        n = x.numel()
        scale_relu[(triton.cdiv(n, 1024),)](x, out, n, float(self.scale), BLOCK=1024)
        return out
