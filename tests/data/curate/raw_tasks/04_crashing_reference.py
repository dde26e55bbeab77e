"""Projection whose weight has the wrong shape: the reference itself crashes."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(dim + 1, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(x, self.weight)


batch = 16
dim = 64


def get_inputs():
    return [torch.randn(batch, dim)]


def get_init_inputs():
    return [dim]
