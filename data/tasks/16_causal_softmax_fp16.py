"""Scaled, causally masked softmax of half-precision attention scores (softmax)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        seq = scores.shape[-1]
        future = torch.ones(seq, seq, dtype=torch.bool, device=scores.device).triu(1)
        return torch.softmax((scores * self.scale).masked_fill(future, float("-inf")), dim=-1)


batch_heads = 64
seq_len = 1024
head_dim = 64
dtype = torch.float16


def get_inputs():
    return [torch.randn(batch_heads, seq_len, seq_len, dtype=dtype) * head_dim**0.5]


def get_init_inputs():
    return [head_dim**-0.5]


# kernelrl metadata, read by the loader with ast.literal_eval (never executed to be read).
# "sizes" overrides module globals for a device kind so the task runs in seconds under the
# Triton interpreter on CPU while the GPU size stays realistic.
KERNELRL = {
    "category": "softmax",
    "sizes": {"cpu": {"batch_heads": 2, "seq_len": 29}},
}
