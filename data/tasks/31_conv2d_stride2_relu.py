"""Strided 3x3 nn.Conv2d (stride 2, padding 1) with bias, followed by ReLU (fused)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


batch_size = 16
in_channels = 64
out_channels = 128
height = 128
width = 128


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]


# kernelrl metadata, read by the loader with ast.literal_eval (never executed to be read).
# "sizes" overrides module globals for a device kind so the task runs in seconds under the
# Triton interpreter on CPU while the GPU size stays realistic.
KERNELRL = {
    "category": "fused",
    "sizes": {"cpu": {"batch_size": 2, "in_channels": 6, "out_channels": 18, "height": 13, "width": 11}},
    # cuDNN runs fp32 convolutions in TF32 by default (torch.backends.cudnn.allow_tf32 is True), so
    # the eager reference on a GPU is off by up to ~1e-3 (measured on H100; ~3e-6 with TF32 off).
    "atol": 3e-3,
    "rtol": 3e-3,
}
