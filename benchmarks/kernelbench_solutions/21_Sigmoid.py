# kernelbench: level1/21_Sigmoid.py
# Elementwise sigmoid 1 / (1 + exp(-x)) in fp32 over a flat view (int64 offsets: 1.6e9 elements).
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def sigmoid_kernel(x_ptr, out_ptr, numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = 1.0 / (1.0 + tl.exp(-x))
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        numel = x.numel()
        block = 4096
        sigmoid_kernel[(triton.cdiv(numel, block),)](x, out, numel, BLOCK=block, num_warps=8)
        return out
