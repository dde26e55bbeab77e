import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def add_layernorm_kernel(x_ptr, r_ptr, w_ptr, b_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr):
    # out = layer_norm(x + residual) for one row; the sum is recomputed in every pass instead of
    # being written out and read back.
    row = tl.program_id(0)
    row_offset = row.to(tl.int64) * n_cols
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        h = tl.load(x_ptr + row_offset + cols, mask=mask, other=0.0).to(tl.float32) + \
            tl.load(r_ptr + row_offset + cols, mask=mask, other=0.0).to(tl.float32)
        acc += h
    mean = tl.sum(acc, axis=0) / n_cols
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        h = tl.load(x_ptr + row_offset + cols, mask=mask, other=0.0).to(tl.float32) + \
            tl.load(r_ptr + row_offset + cols, mask=mask, other=0.0).to(tl.float32)
        d = tl.where(mask, h - mean, 0.0)
        acc += d * d
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n_cols + eps)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        h = tl.load(x_ptr + row_offset + cols, mask=mask, other=0.0).to(tl.float32) + \
            tl.load(r_ptr + row_offset + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        y = (h - mean) * rstd * w + b
        tl.store(out_ptr + row_offset + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def add_layernorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                  eps: float) -> torch.Tensor:
    n_cols = x.shape[-1]
    x2 = x.contiguous().view(-1, n_cols)
    r2 = residual.contiguous().view(-1, n_cols)
    out = torch.empty_like(x2)
    block = min(triton.next_power_of_2(n_cols), 4096)
    add_layernorm_kernel[(x2.shape[0],)](x2, r2, weight, bias, out, n_cols, eps, BLOCK=block, num_warps=8)
    return out.view(x.shape)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return add_layernorm(x, residual, self.norm.weight, self.norm.bias, self.norm.eps)
