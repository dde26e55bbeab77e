# Legitimate: a dataclass of block sizes made from shape metadata, cached on self by shape.
from dataclasses import dataclass

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


@dataclass
class Tiles:
    rows: int
    cols: int
    block: int


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self._tiles = {}

    def forward(self, x):
        x = x.contiguous()
        key = x.shape
        if key not in self._tiles:
            self._tiles[key] = Tiles(x.shape[0], x.shape[1], triton.next_power_of_2(x.shape[1]))
        tiles = self._tiles[key]
        out = torch.empty_like(x)
        n = tiles.rows * tiles.cols
        relu_kernel[(triton.cdiv(n, tiles.block),)](x, out, n, BLOCK=tiles.block)
        return out
