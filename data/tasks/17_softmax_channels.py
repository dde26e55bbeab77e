"""Softmax across the channel dimension of an NCHW tensor, at every pixel (softmax)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


batch_size = 32
channels = 256
height = 64
width = 64


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return []


# kernelrl metadata, read by the loader with ast.literal_eval (never executed to be read).
# "sizes" overrides module globals for a device kind so the task runs in seconds under the
# Triton interpreter on CPU while the GPU size stays realistic.
KERNELRL = {
    "category": "softmax",
    "sizes": {"cpu": {"batch_size": 2, "channels": 70, "height": 6, "width": 7}},
}
