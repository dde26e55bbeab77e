"""Index of the maximum along the middle dimension of a 3D tensor (argmax reduction, int64 output)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.argmax(x, dim=1)


batch_size = 32
reduce_dim = 4096
inner_dim = 256


def get_inputs():
    return [torch.randn(batch_size, reduce_dim, inner_dim)]


def get_init_inputs():
    return []


# kernelrl metadata, read by the loader with ast.literal_eval (never executed to be read).
# "sizes" overrides module globals for a device kind so the task runs in seconds under the
# Triton interpreter on CPU while the GPU size stays realistic.
KERNELRL = {
    "category": "reduction",
    "sizes": {"cpu": {"batch_size": 3, "reduce_dim": 300, "inner_dim": 50}},
}
