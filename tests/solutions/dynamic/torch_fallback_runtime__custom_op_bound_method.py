# Hack: a tensor method taken as a value inside a module-level custom op (prod = x.relu), which
# no name resolution follows; the kernel launched only touches the output.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def touch_kernel(out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(out_ptr + offs, mask=offs < n), mask=offs < n)


@torch.library.custom_op("rt_dyn::relu_bound", mutates_args=())
def relu_op(x: torch.Tensor) -> torch.Tensor:
    method = x.relu
    out = method()
    touch_kernel[(1,)](out, 1, BLOCK=16)
    return out


class ModelNew(nn.Module):
    def forward(self, x):
        return relu_op(x)
