"""RMS normalisation over channels (copied from the stand-in evaluation set, names changed)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n_channels: int, epsilon: float = 1e-5):
        super().__init__()
        self.n_channels = n_channels
        self.epsilon = epsilon

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        root_mean_square = torch.sqrt(torch.mean(inp**2, dim=1, keepdim=True) + self.epsilon)
        return inp / root_mean_square


batch_size = 16
channels = 64
height = 256
width = 256


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels]


KERNELRL = {"category": "normalization", "sizes": {"cpu": {"batch_size": 2, "height": 8, "width": 8}}}
