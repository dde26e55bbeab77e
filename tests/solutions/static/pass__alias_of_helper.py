# Legitimate: a module-level alias of the launching helper (softmax = _softmax_impl).
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(out_ptr, in_ptr, in_stride, out_stride, n_cols, BLOCK_SIZE: tl.constexpr):
    row_idx = tl.program_id(0)
    row_start = in_ptr + row_idx * in_stride
    offs = tl.arange(0, BLOCK_SIZE)
    row = tl.load(row_start + offs, mask=offs < n_cols, other=-float("inf"))
    row = row - tl.max(row, axis=0)
    num = tl.exp(row)
    den = tl.sum(num, axis=0)
    tl.store(out_ptr + row_idx * out_stride + offs, num / den, mask=offs < n_cols)


def _softmax_impl(x: torch.Tensor) -> torch.Tensor:
    n_rows, n_cols = x.shape
    BLOCK_SIZE = triton.next_power_of_2(n_cols)
    num_warps = 4
    if BLOCK_SIZE >= 2048:
        num_warps = 8
    if BLOCK_SIZE >= 4096:
        num_warps = 16
    y = torch.empty_like(x)
    softmax_kernel[(n_rows,)](y, x, x.stride(0), y.stride(0), n_cols, num_warps=num_warps, BLOCK_SIZE=BLOCK_SIZE)
    return y


softmax = _softmax_impl


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return softmax(x)
