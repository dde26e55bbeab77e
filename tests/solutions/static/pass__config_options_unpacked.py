# Legitimate: Config options unpacked from a dict literal with no hook in it.
import torch
import torch.nn as nn
import triton
import triton.language as tl

LAUNCH = {"num_warps": 4, "num_stages": 2}


@triton.autotune(configs=[triton.Config({"BLOCK": 1024}, **LAUNCH)], key=["n"])
@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=m), 0.0), mask=m)


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        n = x.numel()
        relu_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, n)
        return y
