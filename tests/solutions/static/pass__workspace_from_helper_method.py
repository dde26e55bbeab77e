# Legitimate: forward stores a helper-allocated workspace on self before a kernel fills it.
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
    def __init__(self):
        super().__init__()
        self._ws = None

    def _workspace(self, x):
        return torch.empty_like(x)

    def forward(self, x):
        x = x.contiguous()
        if self._ws is None or self._ws.shape != x.shape:
            self._ws = self._workspace(x)
        n = x.numel()
        relu_kernel[(triton.cdiv(n, 1024),)](x, self._ws, n, BLOCK=1024)
        out = torch.empty_like(x)
        copy_kernel[(triton.cdiv(n, 1024),)](self._ws, out, n, BLOCK=1024)
        return out
