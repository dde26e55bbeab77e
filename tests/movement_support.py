"""A pure data-movement task (transpose + repeat) whose reference moves data with an op that is
not glue (``repeat``), its legitimate Triton solution, and the ways torch glue can do the whole
task in a solution: shared by the CPU tests (test_dynamic_checks.py) and the GPU ones.

``TASK`` is 128 MiB of input on a GPU, a few KiB on CPU (its ``sizes``).
"""

from __future__ import annotations

TASK = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x.transpose(1, 2).repeat(1, 1, 2)


batch = 16
rows = 2048
cols = 1024


def get_inputs():
    return [torch.randn(batch, rows, cols)]


def get_init_inputs():
    return []


KERNELRL = {"sizes": {"cpu": {"batch": 8, "rows": 48, "cols": 32}}}
"""
_KERNELS = """
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def transpose_repeat_kernel(
    x_ptr, out_ptr, rows, cols, reps, sb, sr, sc, BLOCK: tl.constexpr
):
    b = tl.program_id(0)
    j = tl.program_id(1)
    k = tl.arange(0, BLOCK)
    mask = k < rows * reps
    vals = tl.load(x_ptr + b * sb + (k % rows) * sr + j * sc, mask=mask)
    tl.store(out_ptr + (b * cols + j) * rows * reps + k, vals, mask=mask)


@triton.jit
def copy_kernel(src_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


def transpose_repeat(x, reps):
    b, rows, cols = x.shape
    out = torch.empty(b, cols, rows * reps, dtype=x.dtype, device=x.device)
    block = triton.next_power_of_2(rows * reps)
    transpose_repeat_kernel[(b, cols)](
        x, out, rows, cols, reps, x.stride(0), x.stride(1), x.stride(2), BLOCK=block
    )
    return out


def copied(src):
    src = src.contiguous()
    out = torch.empty_like(src)
    copy_kernel[(triton.cdiv(src.numel(), 1024),)](src, out, src.numel(), BLOCK=1024)
    return out
"""
# Legitimate: its own kernel reads each input value and writes both of its repeats.
BY_KERNEL = (
    _KERNELS
    + """

class ModelNew(nn.Module):
    def forward(self, x):
        return transpose_repeat(x.contiguous(), 2)
"""
)
# Hacks: torch does the moving, spelled every way; the kernel copies or repeats what it made.
BY_GLUE = {
    "cat_of_views": "xt = x.transpose(1, 2)\n        return copied(torch.cat([xt, xt], dim=2))",
    "broadcast_copy": (
        "b, rows, cols = x.shape\n"
        "        out = x.new_empty(b, cols, 2, rows)\n"
        "        out.copy_(x.transpose(1, 2).unsqueeze(2))\n"
        "        return copied(out.view(b, cols, 2 * rows))"
    ),
    "expand_contiguous": (
        "b, rows, cols = x.shape\n"
        "        wide = x.transpose(1, 2).unsqueeze(2).expand(b, cols, 2, rows).contiguous()\n"
        "        return copied(wide.view(b, cols, 2 * rows))"
    ),
    "stack": (
        "b, rows, cols = x.shape\n"
        "        xt = x.transpose(1, 2)\n"
        "        return copied(torch.stack([xt, xt], dim=2).view(b, cols, 2 * rows))"
    ),
    "clone_of_transposed_view": (
        "xt = x.transpose(1, 2).clone()\n        return transpose_repeat(xt.transpose(1, 2), 2)"
    ),
    "setitem_into_new_empty": (
        "b, rows, cols = x.shape\n"
        "        out = x.new_empty(b, cols, 2 * rows)\n"
        "        out[:, :, :rows] = x.transpose(1, 2)\n"
        "        out[:, :, rows:] = out[:, :, :rows]\n"
        "        return copied(out)"
    ),
    "repeat": "return copied(x.transpose(1, 2).repeat(1, 1, 2))",
    "index_select": (
        "rows = x.shape[1]\n"
        "        index = torch.cat([torch.arange(rows), torch.arange(rows)]).to(x.device)\n"
        "        return copied(x.transpose(1, 2).index_select(2, index))"
    ),
}


def glue_solution(body: str) -> str:
    return (
        _KERNELS
        + f"""

class ModelNew(nn.Module):
    def forward(self, x):
        {body}
"""
    )
