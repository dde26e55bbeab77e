# Legitimate: a helper writing attributes on the solution's own config instance.
from dataclasses import dataclass

import torch
import torch.nn as nn
import triton
import triton.language as tl


@dataclass
class KernelCfg:
    block: int = 1024
    num_warps: int = 4


def tune_for(cfg: KernelCfg, n: int) -> KernelCfg:
    if n < 4096:
        cfg.block = 256
        cfg.num_warps = 2
    return cfg


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=m), 0.0), mask=m)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.cfg = KernelCfg()

    def forward(self, x):
        y = torch.empty_like(x)
        n = x.numel()
        cfg = tune_for(KernelCfg(), n)
        relu_kernel[(triton.cdiv(n, cfg.block),)](x, y, n, BLOCK=cfg.block, num_warps=cfg.num_warps)
        return y
