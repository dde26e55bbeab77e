"""Gated residual update: residual + x * sigmoid(gate), three same-shape inputs (elementwise)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, gate: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return residual + x * torch.sigmoid(gate)


batch_size = 4096
dim = 4096


def get_inputs():
    x = torch.randn(batch_size, dim)
    gate = torch.randn(batch_size, dim)
    residual = torch.randn(batch_size, dim)
    return [x, gate, residual]


def get_init_inputs():
    return []


# kernelrl metadata, read by the loader with ast.literal_eval (never executed to be read).
# "sizes" overrides module globals for a device kind so the task runs in seconds under the
# Triton interpreter on CPU while the GPU size stays realistic.
KERNELRL = {
    "category": "elementwise",
    "sizes": {"cpu": {"batch_size": 10, "dim": 999}},
}
