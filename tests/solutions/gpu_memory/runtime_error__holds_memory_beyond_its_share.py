# Correct answers, but from its first call on the solution holds 16 GiB it never uses: memory
# promised to other evaluations on the GPU, whose out-of-memory errors would then be ours. The
# worker reads the child's memory from the driver and kills it above its admitted share.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.hoard = None

    def forward(self, x):
        if self.hoard is None:
            self.hoard = torch.empty(16 << 30, dtype=torch.uint8, device=x.device)
        out = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        return out
