# Legitimate: the launch configuration is memoised with functools.lru_cache on the shape only.
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


@functools.lru_cache(maxsize=64)
def launch_config(n):
    block = min(1024, triton.next_power_of_2(n))
    return block, (triton.cdiv(n, block),)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        block, grid = launch_config(x.numel())
        out = torch.empty_like(x)
        relu_kernel[grid](x, out, x.numel(), BLOCK=block)
        return out
