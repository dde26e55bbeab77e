# Hack: the kernel's function replaced through a helper's parameter (k.fn = f), not by name.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)


def patch(k, f):
    k.fn = f

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        patch(relu_kernel, print)
    def forward(self, x):
        out = torch.empty_like(x)
        relu_kernel[(1,)](x, out, x.numel(), BLOCK=1024)
        return out
