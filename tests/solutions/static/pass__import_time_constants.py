# Legitimate: arithmetic at import on Python numbers, dtypes' limits and shapes, and a tensor
# allocated there without computing on it.
import math

import torch
import torch.nn as nn
import triton
import triton.language as tl

BLOCK = tl.constexpr(2**10)
LOG2E = 1.0 / math.log(2.0)
SIZES = [2**i for i in range(4, 11)]
HALF_MAX = torch.finfo(torch.float16).max * 0.5
DTYPES = {torch.float16: tl.float16, torch.float32: tl.float32}
ZERO = torch.zeros(1)
ZERO_WORDS = ZERO.numel() * 4 + ZERO.shape[0] - 1
NEGATIVE = -1


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    WARPS = 4 * 2

    def forward(self, x):
        out = torch.empty_like(x)
        grid = (triton.cdiv(x.numel(), BLOCK),)
        relu_kernel[grid](x, out, x.numel(), BLOCK=BLOCK, num_warps=self.WARPS // 2)
        return out
