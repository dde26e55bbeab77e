"""Layer normalization of each row with affine weight and bias given as inputs (normalization)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), weight, bias, self.eps)


batch_size = 4096
dim = 8192
eps = 1e-5


def get_inputs():
    x = torch.randn(batch_size, dim)
    weight = torch.randn(dim)
    bias = torch.randn(dim)
    return [x, weight, bias]


def get_init_inputs():
    return [eps]


# kernelrl metadata, read by the loader with ast.literal_eval (never executed to be read).
# "sizes" overrides module globals for a device kind so the task runs in seconds under the
# Triton interpreter on CPU while the GPU size stays realistic.
KERNELRL = {
    "category": "normalization",
    "sizes": {"cpu": {"batch_size": 6, "dim": 5000}},
}
