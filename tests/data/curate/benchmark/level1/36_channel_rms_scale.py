"""Stand-in evaluation task (our own text, KernelBench folder layout): divide by the RMS over dim 1."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, channels: int, eps: float = 1e-5):
        super().__init__()
        self.channels = channels
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.sqrt(torch.mean(x**2, dim=1, keepdim=True) + self.eps)
        return x / scale


batch_size = 16
channels = 64
height = 256
width = 256


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels]
