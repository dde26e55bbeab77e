# Legitimate: a module-level launch-config cache filled by a helper given a column count.
from typing import Dict, Tuple

import torch
import torch.nn as nn
import triton
import triton.language as tl

_CONFIG_CACHE: Dict[int, Tuple[int, int]] = {}


def _launch_config(n_cols: int) -> Tuple[int, int]:
    cfg = _CONFIG_CACHE.get(n_cols)
    if cfg is None:
        block = triton.next_power_of_2(n_cols)
        num_warps = 4 if block <= 2048 else 8
        cfg = (block, num_warps)
        _CONFIG_CACHE[n_cols] = cfg
    return cfg


@triton.jit
def softmax_kernel(x_ptr, y_ptr, stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride + offs, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    tl.store(y_ptr + row * stride + offs, e / tl.sum(e, axis=0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        block, num_warps = _launch_config(x.shape[-1])
        softmax_kernel[(x.shape[0],)](x, y, x.stride(0), x.shape[-1], BLOCK=block, num_warps=num_warps)
        return y
