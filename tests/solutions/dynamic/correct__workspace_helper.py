# Legitimate: a scratch buffer allocated by a helper (empty_like, sized from the input) and
# reused across calls; it is never returned, the output is fresh on every call.
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
        self._scratch = None

    def _workspace(self, x):
        if self._scratch is None or self._scratch.shape != x.shape:
            self._scratch = torch.empty_like(x)
        return self._scratch

    def forward(self, x):
        x = x.contiguous()
        n = x.numel()
        grid = (triton.cdiv(n, 1024),)
        scratch = self._workspace(x)
        relu_kernel[grid](x, scratch, n, BLOCK=1024)
        out = torch.empty_like(x)
        copy_kernel[grid](scratch, out, n, BLOCK=1024)
        return out
