"""Transformer MLP block: up-projection, GELU, down-projection, residual and LayerNorm."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, hidden: int, expansion: int, eps: float = 1e-5):
        super().__init__()
        self.up = nn.Linear(hidden, hidden * expansion)
        self.down = nn.Linear(hidden * expansion, hidden)
        self.norm = nn.LayerNorm(hidden, eps=eps)
        self.scale = nn.Parameter(torch.ones(hidden) * 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        h = F.gelu(h)
        h = self.down(h)
        h = h * self.scale
        return self.norm(x + h)


tokens = 2048
hidden = 1024
expansion = 4


def get_inputs():
    return [torch.randn(tokens, hidden)]


def get_init_inputs():
    return [hidden, expansion]


KERNELRL = {"category": "fused", "sizes": {"cpu": {"tokens": 12, "hidden": 32, "expansion": 2}}}
