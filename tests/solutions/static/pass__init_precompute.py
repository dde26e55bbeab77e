# task: 21_linear
# Legitimate: weights are prepared once in __init__; forward only launches the kernel.
# (The kernel is a relu stand-in: the static checks do not judge numerics.)
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


def launch_relu(x, out):
    relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
    return out

class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.weight_t = self.linear.weight.detach().t().contiguous()

    def forward(self, x):
        out = torch.empty(x.shape[0], self.linear.out_features, device=x.device, dtype=x.dtype)
        return launch_relu(x, out)
