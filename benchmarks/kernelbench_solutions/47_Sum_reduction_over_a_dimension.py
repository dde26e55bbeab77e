# kernelbench: level1/47_Sum_reduction_over_a_dimension.py
# Sum over one dimension (keepdim). The input is seen as (outer, R, inner) with the reduced
# dimension in the middle; each program owns a block of `inner` columns of one `outer` slice and
# walks R in tiles of BLOCK_R rows, accumulating in fp32. Works for any dim, inner == 1 included.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def sum_dim_kernel(x_ptr, out_ptr, R, inner, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr):
    o = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    col_mask = cols < inner
    base = x_ptr + o * R * inner
    acc = tl.zeros([BLOCK_R, BLOCK_I], dtype=tl.float32)
    for r0 in range(0, R, BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        ptrs = base + rows.to(tl.int64)[:, None] * inner + cols[None, :]
        mask = (rows[:, None] < R) & col_mask[None, :]
        acc += tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    total = tl.sum(acc, axis=0)
    tl.store(out_ptr + o * inner + cols, total.to(out_ptr.dtype.element_ty), mask=col_mask)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        dim = self.dim % x.dim()
        outer = 1
        for s in x.shape[:dim]:
            outer *= s
        inner = 1
        for s in x.shape[dim + 1 :]:
            inner *= s
        R = x.shape[dim]
        out_shape = list(x.shape)
        out_shape[dim] = 1
        out = torch.empty(out_shape, dtype=x.dtype, device=x.device)
        block_i = min(256, triton.next_power_of_2(inner))
        block_r = 8
        grid = (outer, triton.cdiv(inner, block_i))
        sum_dim_kernel[grid](x, out, R, inner, BLOCK_R=block_r, BLOCK_I=block_i, num_warps=4)
        return out
