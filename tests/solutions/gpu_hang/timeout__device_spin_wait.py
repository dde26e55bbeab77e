# Fault: a kernel that waits forever on the device for a flag nobody sets.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def spin_kernel(flag_ptr, x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    flag = tl.load(flag_ptr, volatile=True)
    while flag == 0:
        flag = tl.load(flag_ptr, volatile=True)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        flag = torch.zeros(1, dtype=torch.int32, device=x.device)
        out = torch.empty_like(x)
        spin_kernel[(triton.cdiv(x.numel(), 1024),)](flag, x, out, x.numel(), BLOCK=1024)
        return out
