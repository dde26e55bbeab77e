# Legitimate: libdevice's tanh, which only a GPU compile provides. Triton's CPU interpreter runs
# libdevice's functions as empty stubs, so on CPU this is not_run, never the kernel's error.
import torch
import torch.nn as nn
import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    # tanh(x) * 0 is exactly 0 for every finite x: the output is ReLU's
    tl.store(out_ptr + offs, tl.maximum(x + libdevice.tanh(x) * 0.0, 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        relu_kernel[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024)
        return out
