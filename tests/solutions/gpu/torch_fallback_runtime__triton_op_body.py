# Hack (GPU evidence): a triton_op whose body does the ReLU with torch; the profiler sees the body's aten ops.
import torch
import torch.nn as nn
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton


@triton.jit
def copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


@triton_op("kbsol::fake_relu", mutates_args={})
def relu(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    wrap_triton(copy_kernel)[(triton.cdiv(n, 1024),)](torch.clamp_min(x, 0.0), out, n, BLOCK=1024)
    return out


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.ops.kbsol.fake_relu(x.contiguous())
