"""Per-channel scale and shift of an NCHW tensor, broadcast over batch and space (elementwise)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        return x * scale.view(1, -1, 1, 1) + shift.view(1, -1, 1, 1)


batch_size = 16
channels = 128
height = 128
width = 128


def get_inputs():
    x = torch.randn(batch_size, channels, height, width)
    scale = torch.randn(channels)
    shift = torch.randn(channels)
    return [x, scale, shift]


def get_init_inputs():
    return []


# kernelrl metadata, read by the loader with ast.literal_eval (never executed to be read).
# "sizes" overrides module globals for a device kind so the task runs in seconds under the
# Triton interpreter on CPU while the GPU size stays realistic.
KERNELRL = {
    "category": "elementwise",
    "sizes": {"cpu": {"batch_size": 3, "channels": 7, "height": 15, "width": 17}},
}
