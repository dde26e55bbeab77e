# task: 06_row_sum
# Legitimate: a two-stage reduction with a per-call scratch buffer and a kernel for each stage.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def partial_sum_kernel(x_ptr, part_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n_cols + offs, mask=offs < n_cols, other=0.0)
    tl.store(part_ptr + row * tl.num_programs(1) + chunk, tl.sum(x, axis=0))


@triton.jit
def finish_kernel(part_ptr, out_ptr, n_parts, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + row, tl.sum(tl.load(part_ptr + row * n_parts + offs, mask=offs < n_parts, other=0.0), axis=0))


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        rows, cols = x.shape
        chunks = triton.cdiv(cols, 256)
        parts = torch.empty(rows, chunks, device=x.device, dtype=torch.float32)
        partial_sum_kernel[(rows, chunks)](x, parts, cols, BLOCK=256)
        out = torch.empty(rows, device=x.device, dtype=x.dtype)
        finish_kernel[(rows,)](parts, out, chunks, BLOCK=triton.next_power_of_2(chunks))
        return out
