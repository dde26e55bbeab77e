"""Elementwise natural log of normally distributed inputs: NaN for negative values."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x) * 0.5


size = 1 << 20


def get_inputs():
    return [torch.randn(size)]


def get_init_inputs():
    return []


KERNELRL = {"sizes": {"cpu": {"size": 4096}}}
