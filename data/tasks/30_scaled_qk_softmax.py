"""Attention probabilities softmax(Q K^T * scale) over the keys, per batch-head (fused)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        scores = torch.bmm(q, k.transpose(1, 2)) * self.scale
        return torch.softmax(scores, dim=-1)


batch_heads = 32
seq_len = 1024
head_dim = 64


def get_inputs():
    return [torch.randn(batch_heads, seq_len, head_dim), torch.randn(batch_heads, seq_len, head_dim)]


def get_init_inputs():
    return [head_dim**-0.5]


# kernelrl metadata, read by the loader with ast.literal_eval (never executed to be read).
# "sizes" overrides module globals for a device kind so the task runs in seconds under the
# Triton interpreter on CPU while the GPU size stays realistic.
KERNELRL = {
    "category": "fused",
    "sizes": {"cpu": {"batch_heads": 2, "seq_len": 40, "head_dim": 24}},
}
