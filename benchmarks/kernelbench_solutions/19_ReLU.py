# kernelbench: level1/19_ReLU.py
# Elementwise ReLU over a flat view. Offsets are int64: the published input has 1.6e9 elements.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, tl.maximum(x, 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        numel = x.numel()
        block = 4096
        relu_kernel[(triton.cdiv(numel, block),)](x, out, numel, BLOCK=block, num_warps=8)
        return out
