# Legitimate: attributes written only on the solution's own objects (self, an autograd ctx, an
# instance of its own class, its class) and requires_grad on its parameters.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * scale, mask=mask)


class LaunchPlan:
    def __init__(self, block):
        self.block = block


class ScaleFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        out = torch.empty_like(x)
        n = x.numel()
        scale_kernel[(triton.cdiv(n, 1024),)](x, out, n, scale, BLOCK=1024)
        return out


class ModelNew(nn.Module):
    calls = 0

    def __init__(self):
        super().__init__()
        self.plan = LaunchPlan(1024)
        self.plan.block = 1024
        plan = LaunchPlan(512)
        plan.block = 1024
        self.dummy = nn.Linear(2, 2)
        for p in self.dummy.parameters():
            p.requires_grad = False

    def forward(self, x):
        return ScaleFn.apply(x.contiguous(), 1.0)
