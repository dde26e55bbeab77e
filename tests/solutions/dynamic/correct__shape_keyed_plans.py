# Legitimate: launch configs and a scratch buffer cached in a dict keyed by (shape, dtype).
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
        self._plans = {}

    def forward(self, x):
        x = x.contiguous()
        key = (x.shape, x.dtype)
        plan = self._plans.get(key)
        if plan is None:
            n = x.numel()
            block = min(1024, triton.next_power_of_2(n))
            plan = (block, (triton.cdiv(n, block),), torch.empty_like(x))
            self._plans[key] = plan
        block, grid, scratch = plan
        relu_kernel[grid](x, scratch, x.numel(), BLOCK=block)
        out = torch.empty_like(x)
        copy_kernel[grid](scratch, out, x.numel(), BLOCK=block)
        return out
