# Legitimate: a scratch buffer kept by a helper given the row count and device.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def row_stats_kernel(x_ptr, stats_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], -float("inf"), tl.float32)
    for start in range(0, n_cols, BLOCK):
        c = start + offs
        m = tl.maximum(m, tl.load(x_ptr + row * stride + c, mask=c < n_cols, other=-float("inf")))
    mx = tl.max(m, axis=0)
    s = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        c = start + offs
        v = tl.load(x_ptr + row * stride + c, mask=c < n_cols, other=-float("inf"))
        s += tl.exp(v - mx)
    tl.store(stats_ptr + row * 2, mx)
    tl.store(stats_ptr + row * 2 + 1, tl.sum(s, axis=0))


@triton.jit
def normalize_kernel(x_ptr, stats_ptr, y_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    blk = tl.program_id(1)
    c = blk * BLOCK + tl.arange(0, BLOCK)
    mx = tl.load(stats_ptr + row * 2)
    s = tl.load(stats_ptr + row * 2 + 1)
    v = tl.load(x_ptr + row * stride + c, mask=c < n_cols, other=0.0)
    tl.store(y_ptr + row * n_cols + c, tl.exp(v - mx) / s, mask=c < n_cols)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self._scratch = None

    def _stats_buffer(self, rows: int, device: torch.device) -> torch.Tensor:
        if self._scratch is None or self._scratch.shape[0] < rows or self._scratch.device != device:
            self._scratch = torch.empty((rows, 2), dtype=torch.float32, device=device)
        return self._scratch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows, cols = x.shape
        stats = self._stats_buffer(rows, x.device)
        y = torch.empty_like(x)
        BLOCK = 1024
        row_stats_kernel[(rows,)](x, stats, cols, x.stride(0), BLOCK=BLOCK)
        normalize_kernel[(rows, triton.cdiv(cols, BLOCK))](x, stats, y, cols, x.stride(0), BLOCK=BLOCK)
        return y
