"""Row-wise softmax of attention scores."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        return torch.softmax(scores, dim=-1)


rows = 4096
cols = 2048


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return []


KERNELRL = {"category": "softmax", "sizes": {"cpu": {"rows": 6, "cols": 700}}}
