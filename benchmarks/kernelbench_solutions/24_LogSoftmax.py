# kernelbench: level1/24_LogSoftmax.py
# Row log-softmax over the last of two dimensions: an online pass for max and sum of
# exp(x - max) per lane, combined across lanes, then x - max - log(sum).
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def log_softmax_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * n_cols
    out_row = out_ptr + row * n_cols
    m_vec = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    s_vec = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m_vec, x)
        scale = tl.where(m_new == float("-inf"), 0.0, tl.exp(m_vec - m_new))
        s_vec = s_vec * scale + tl.where(m_new == float("-inf"), 0.0, tl.exp(x - m_new))
        m_vec = m_new
    m = tl.max(m_vec, axis=0)
    s = tl.sum(tl.where(m_vec == float("-inf"), 0.0, s_vec * tl.exp(m_vec - m)), axis=0)
    shift = m + tl.log(s)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_row + cols, (x - shift).to(out_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, dim: int = 1):
        super().__init__()
        if dim not in (1, -1):
            raise ValueError("this kernel handles log-softmax over the last of two dimensions")
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        rows, n_cols = x.shape
        out = torch.empty_like(x)
        block = min(4096, triton.next_power_of_2(n_cols))
        log_softmax_kernel[(rows,)](x, out, n_cols, BLOCK=block, num_warps=8)
        return out
