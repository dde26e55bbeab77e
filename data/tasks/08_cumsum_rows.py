"""Inclusive prefix sum along each row of a matrix (scan reduction)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, dim=1)


batch_size = 4096
dim = 8192


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []


# kernelrl metadata, read by the loader with ast.literal_eval (never executed to be read).
# "sizes" overrides module globals for a device kind so the task runs in seconds under the
# Triton interpreter on CPU while the GPU size stays realistic.
KERNELRL = {
    "category": "reduction",
    "sizes": {"cpu": {"batch_size": 5, "dim": 3000}},
    # Running fp32 sums over 8192 values reach |s| ~ 300; two correct scans that add in a
    # different order differ by up to ~4e-4 where the running sum crosses zero (measured on H100
    # against torch.cumsum), above the 1e-4 default atol.
    "atol": 1e-3,
}
