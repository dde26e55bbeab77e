# Legitimate: a plan object (block sizes, grid) built from the input's shape in forward and kept
# per shape; it holds ints, never values of the inputs.
from dataclasses import dataclass

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


class Plan:
    def __init__(self, n):
        self.n = n
        self.block = min(1024, triton.next_power_of_2(n))
        self.grid = (triton.cdiv(n, self.block),)


@dataclass
class Tiles:
    cols: int
    block: int


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self._plans = {}

    def forward(self, x):
        x = x.contiguous()
        tiles = Tiles(x.shape[1], triton.next_power_of_2(x.shape[1]))
        plan = self._plans.get(x.shape)
        if plan is None:
            plan = Plan(x.numel())
            self._plans[x.shape] = plan
        out = torch.empty_like(x)
        relu_kernel[plan.grid](x, out, plan.n, BLOCK=plan.block)
        return out
