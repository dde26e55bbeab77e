# Legitimate: self.fn = Fn.apply bound in __init__ and called in forward.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def ln_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    base = row * N
    acc = tl.zeros([BLOCK], tl.float32)
    for s in range(0, N, BLOCK):
        c = s + offs
        acc += tl.load(x_ptr + base + c, mask=c < N, other=0.0)
    mean = tl.sum(acc, 0) / N
    acc = tl.zeros([BLOCK], tl.float32)
    for s in range(0, N, BLOCK):
        c = s + offs
        d = tl.where(c < N, tl.load(x_ptr + base + c, mask=c < N, other=0.0) - mean, 0.0)
        acc += d * d
    rstd = tl.rsqrt(tl.sum(acc, 0) / N + eps)
    for s in range(0, N, BLOCK):
        c = s + offs
        m = c < N
        x = tl.load(x_ptr + base + c, mask=m, other=0.0)
        tl.store(y_ptr + base + c, (x - mean) * rstd * tl.load(w_ptr + c, mask=m) + tl.load(b_ptr + c, mask=m), mask=m)


class TritonLayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(x, weight, bias, eps):
        M, N = x.shape
        y = torch.empty_like(x)
        ln_kernel[(M,)](x, weight, bias, y, N, eps, BLOCK=1024)
        return y

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, bias, eps = inputs
        ctx.save_for_backward(x, weight)
        ctx.eps = eps

    @staticmethod
    def backward(ctx, dy):
        raise NotImplementedError


class ModelNew(nn.Module):
    def __init__(self, eps):
        super().__init__()
        self.eps = eps
        self.fn = TritonLayerNorm.apply

    def forward(self, x, weight, bias):
        return self.fn(x.contiguous(), weight, bias, self.eps)
