# Legitimate: ops registered by assignment (triton_op(...)(fn), custom_op(name, fn)) and called
# through the returned object and through torch.ops.<ns>.<name>.<overload>.
import torch
import torch.nn as nn
import triton
import triton.language as tl
from torch.library import custom_op, triton_op, wrap_triton


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


def relu_impl(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    wrap_triton(relu_kernel)[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024)
    return out


relu_op = triton_op("kbsol::relu_a", mutates_args=())(relu_impl)
copy_op = custom_op("kbsol::copy_b", relu_impl, mutates_args=())


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.ops.kbsol.copy_b.default(relu_op(x.contiguous()))
