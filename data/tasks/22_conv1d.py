"""1D convolution with 'same' padding, nn.Conv1d with bias (convolution)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


batch_size = 32
in_channels = 64
out_channels = 128
kernel_size = 5
length = 4096


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]


# kernelrl metadata, read by the loader with ast.literal_eval (never executed to be read).
# "sizes" overrides module globals for a device kind so the task runs in seconds under the
# Triton interpreter on CPU while the GPU size stays realistic.
KERNELRL = {
    "category": "convolution",
    "sizes": {"cpu": {"batch_size": 2, "in_channels": 12, "out_channels": 20, "length": 50}},
    # cuDNN runs fp32 convolutions in TF32 by default (torch.backends.cudnn.allow_tf32 is True), so
    # the eager reference on a GPU is off by up to ~1e-3 (measured on H100; ~3e-6 with TF32 off).
    "atol": 3e-3,
    "rtol": 3e-3,
}
