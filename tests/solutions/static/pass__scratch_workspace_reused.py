# task: 06_row_sum
# Legitimate: a two-stage reduction whose scratch buffer persists across calls; the output is fresh.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


@triton.jit
def copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


def launch_copy(x, out):
    n = x.numel()
    copy_kernel[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024)
    return out


def launch_relu(x, out):
    n = x.numel()
    relu_kernel[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024)
    return out


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
    parts = tl.load(part_ptr + row * n_parts + offs, mask=offs < n_parts, other=0.0)
    tl.store(out_ptr + row, tl.sum(parts, axis=0))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self._workspace = None

    def forward(self, x):
        x = x.contiguous()
        rows, cols = x.shape
        chunks = triton.cdiv(cols, 256)
        if self._workspace is None or self._workspace.numel() < rows * chunks:
            self._workspace = torch.empty(rows * chunks, device=x.device, dtype=torch.float32)
        parts = self._workspace[: rows * chunks]
        partial_sum_kernel[(rows, chunks)](x, parts, cols, BLOCK=256)
        out = torch.empty(rows, device=x.device, dtype=x.dtype)
        finish_kernel[(rows,)](parts, out, chunks, BLOCK=triton.next_power_of_2(chunks))
        return out
