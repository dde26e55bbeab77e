# Legitimate: a launch config (a dataclass) cached by shape in a helper method given shapes.
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.nn as nn
import triton
import triton.language as tl


@dataclass(frozen=True)
class LaunchConfig:
    block: int
    num_warps: int
    grid: Tuple[int, ...]


@triton.jit
def _layernorm_row(x_ptr, w_ptr, b_ptr, y_ptr, stride_x, stride_y, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / N
    xc = tl.where(mask, x - mean, 0.0)
    var = tl.sum(xc * xc, axis=0) / N
    rstd = tl.rsqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=1.0)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0)
    tl.store(y_ptr + row * stride_y + cols, xc * rstd * w + b, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, eps: float) -> None:
        super().__init__()
        self.eps = float(eps)
        self._configs: dict[tuple[int, int], LaunchConfig] = {}

    def _config(self, M: int, N: int) -> LaunchConfig:
        key = (M, N)
        cfg = self._configs.get(key)
        if cfg is None:
            block = triton.next_power_of_2(N)
            if block > 16384:
                raise ValueError(f"row of {N} elements too wide for a single-block layernorm")
            cfg = LaunchConfig(block=block, num_warps=4 if block <= 2048 else 8, grid=(M,))
            self._configs[key] = cfg
        return cfg

    def forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        orig_shape = x.shape
        N = orig_shape[-1]
        x2d = x.reshape(-1, N)
        if x2d.stride(-1) != 1:
            x2d = x2d.contiguous()
        M = x2d.shape[0]
        y = torch.empty_strided((M, N), (N, 1), dtype=x.dtype, device=x.device)
        cfg = self._config(M, N)
        _layernorm_row[cfg.grid](
            x2d, weight, bias, y, x2d.stride(0), y.stride(0), N, self.eps,
            BLOCK=cfg.block, num_warps=cfg.num_warps,
        )
        return y.view(orig_shape)
