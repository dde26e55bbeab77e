# Legitimate: torch.library.register_autograd with a free setup_context writing ctx attributes.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def ln_fwd_kernel(x_ptr, w_ptr, b_ptr, y_ptr, rstd_ptr, N, stride, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for s in range(0, N, BLOCK):
        c = s + offs
        acc += tl.load(x_ptr + row * stride + c, mask=c < N, other=0.0)
    mean = tl.sum(acc, 0) / N
    acc = tl.zeros([BLOCK], tl.float32)
    for s in range(0, N, BLOCK):
        c = s + offs
        d = tl.where(c < N, tl.load(x_ptr + row * stride + c, mask=c < N, other=0.0) - mean, 0.0)
        acc += d * d
    rstd = 1.0 / tl.sqrt(tl.sum(acc, 0) / N + eps)
    tl.store(rstd_ptr + row, rstd)
    for s in range(0, N, BLOCK):
        c = s + offs
        m = c < N
        x = tl.load(x_ptr + row * stride + c, mask=m, other=0.0)
        tl.store(y_ptr + row * stride + c, (x - mean) * rstd * tl.load(w_ptr + c, mask=m) + tl.load(b_ptr + c, mask=m), mask=m)


@torch.library.custom_op("tln::layer_norm_fwd", mutates_args=())
def layer_norm_fwd(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    M, N = x.shape
    y = torch.empty_like(x)
    rstd = torch.empty(M, device=x.device, dtype=torch.float32)
    ln_fwd_kernel[(M,)](x, weight, bias, y, rstd, N, x.stride(0), eps, BLOCK=1024)
    return y, rstd


@torch.library.register_fake("tln::layer_norm_fwd")
def _(x, weight, bias, eps):
    return torch.empty_like(x), x.new_empty(x.shape[0], dtype=torch.float32)


def setup_context(ctx, inputs, output):
    x, weight, bias, eps = inputs
    y, rstd = output
    ctx.save_for_backward(x, weight, rstd)
    ctx.eps = eps


def backward(ctx, grad_y, grad_rstd):
    raise NotImplementedError("inference-only kernel")


torch.library.register_autograd("tln::layer_norm_fwd", backward, setup_context=setup_context)


class ModelNew(nn.Module):
    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps

    def forward(self, x, weight, bias):
        shape = x.shape
        y, _ = layer_norm_fwd(x.reshape(-1, shape[-1]).contiguous(), weight, bias, self.eps)
        return y.view(shape)
