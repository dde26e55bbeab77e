"""SiLU (x * sigmoid(x)) over a large half-precision activation tensor (elementwise)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x)


batch_size = 8192
dim = 8192
dtype = torch.float16


def get_inputs():
    return [torch.randn(batch_size, dim, dtype=dtype)]


def get_init_inputs():
    return []


# kernelrl metadata, read by the loader with ast.literal_eval (never executed to be read).
# "sizes" overrides module globals for a device kind so the task runs in seconds under the
# Triton interpreter on CPU while the GPU size stays realistic.
KERNELRL = {
    "category": "elementwise",
    "sizes": {"cpu": {"batch_size": 13, "dim": 517}},
}
