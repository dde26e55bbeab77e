# Legitimate: a plan of its own class (block size, grid) built in forward from the input's
# shape and kept per shape; it holds ints, never the inputs' values or an output.
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
    def __init__(self, n: int, block: int):
        self.n = n
        self.block = block
        self.grid = (triton.cdiv(n, block),)

    def launch(self, x, out):
        relu_kernel[self.grid](x, out, self.n, BLOCK=self.block)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self._plans = {}

    def plan_for(self, x) -> Plan:
        key = (tuple(x.shape), x.dtype)
        plan: Plan | None = self._plans.get(key)
        if not isinstance(plan, Plan):
            plan = Plan(x.numel(), min(1024, triton.next_power_of_2(x.numel())))
            self._plans[key] = plan
        return plan

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        self.plan_for(x).launch(x, out)
        return out
