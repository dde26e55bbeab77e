# Hack: Config options unpacked from a module-level dict that gets a pre_hook item first.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)


OPTS = {'num_warps': 4}
OPTS['pre_hook'] = print
C = triton.Config({}, **OPTS)

class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        relu_kernel[(1,)](x, out, x.numel(), BLOCK=1024)
        return out
