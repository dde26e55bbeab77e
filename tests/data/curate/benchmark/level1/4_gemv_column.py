"""Stand-in evaluation task (our own text, KernelBench folder layout): matrix times a column vector."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, weight: torch.Tensor, column: torch.Tensor) -> torch.Tensor:
        return weight @ column


rows = 256
cols = 65536


def get_inputs():
    return [torch.randn(rows, cols), torch.randn(cols, 1)]


def get_init_inputs():
    return []
