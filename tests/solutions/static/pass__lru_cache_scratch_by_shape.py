# Legitimate: a scratch buffer memoised with lru_cache on (shape, dtype, device) only.
import functools

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


@functools.lru_cache(maxsize=8)
def scratch_for(shape, dtype, device):
    return torch.empty(shape, dtype=dtype, device=device)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        scratch = scratch_for(tuple(x.shape), x.dtype, x.device)
        n = x.numel()
        relu_kernel[(triton.cdiv(n, 1024),)](x, scratch, n, BLOCK=1024)
        out = torch.empty_like(x)
        copy_kernel[(triton.cdiv(n, 1024),)](scratch, out, n, BLOCK=1024)
        return out
