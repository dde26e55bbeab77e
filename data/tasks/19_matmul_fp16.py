"""Half-precision matrix product C = A @ B with fp32 accumulation (matmul)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)


M = 4096
K = 4096
N = 4096
dtype = torch.float16


def get_inputs():
    return [torch.randn(M, K, dtype=dtype), torch.randn(K, N, dtype=dtype)]


def get_init_inputs():
    return []


# kernelrl metadata, read by the loader with ast.literal_eval (never executed to be read).
# "sizes" overrides module globals for a device kind so the task runs in seconds under the
# Triton interpreter on CPU while the GPU size stays realistic.
KERNELRL = {
    "category": "matmul",
    "sizes": {"cpu": {"M": 64, "K": 48, "N": 56}},
}
