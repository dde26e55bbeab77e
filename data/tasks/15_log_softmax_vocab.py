"""Log-softmax over a vocabulary-sized last dimension (softmax)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(logits, dim=-1)


batch_size = 1024
vocab_size = 32768


def get_inputs():
    return [torch.randn(batch_size, vocab_size) * 4.0]


def get_init_inputs():
    return []


# kernelrl metadata, read by the loader with ast.literal_eval (never executed to be read).
# "sizes" overrides module globals for a device kind so the task runs in seconds under the
# Triton interpreter on CPU while the GPU size stays realistic.
KERNELRL = {
    "category": "softmax",
    "sizes": {"cpu": {"batch_size": 4, "vocab_size": 9000}},
}
