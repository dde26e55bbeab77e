"""Batched matrix product of two 3D tensors, torch.bmm (matmul)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a, b)


batch_size = 32
M = 512
K = 1024
N = 512


def get_inputs():
    return [torch.randn(batch_size, M, K), torch.randn(batch_size, K, N)]


def get_init_inputs():
    return []


# kernelrl metadata, read by the loader with ast.literal_eval (never executed to be read).
# "sizes" overrides module globals for a device kind so the task runs in seconds under the
# Triton interpreter on CPU while the GPU size stays realistic.
KERNELRL = {
    "category": "matmul",
    "sizes": {"cpu": {"batch_size": 3, "M": 33, "K": 40, "N": 50}},
    # fp32 sums over K=1024 unit-variance products (|C| ~ 32): summation order alone can move
    # results by ~5e-5 absolute near C = 0, too close to the 1e-4 default for correct kernels.
    "atol": 1e-3,
    "rtol": 1e-3,
}
