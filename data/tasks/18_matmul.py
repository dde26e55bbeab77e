"""Single-precision matrix product C = A @ B of two dense matrices (matmul)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)


M = 2048
K = 2048
N = 2048


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []


# kernelrl metadata, read by the loader with ast.literal_eval (never executed to be read).
# "sizes" overrides module globals for a device kind so the task runs in seconds under the
# Triton interpreter on CPU while the GPU size stays realistic.
KERNELRL = {
    "category": "matmul",
    "sizes": {"cpu": {"M": 48, "K": 56, "N": 40}},
    # fp32 sums over K=2048 products of unit-variance values (|C| ~ 45): two correct kernels
    # that add in different orders can differ by ~1e-4 absolute near C = 0 (fp32 vs fp64 on CPU
    # at this size: 7e-5), which the 1e-4 default would reject.
    "atol": 1e-3,
    "rtol": 1e-3,
}
