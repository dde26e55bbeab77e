"""Stand-in evaluation task (our own text, KernelBench folder layout): running sum along a dim."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, axis: int):
        super().__init__()
        self.axis = axis

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        return values.cumsum(self.axis)


rows = 128
length = 4000
axis = 1


def get_inputs():
    return [torch.randn(rows, length)]


def get_init_inputs():
    return [axis]
