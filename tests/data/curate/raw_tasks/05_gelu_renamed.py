"""Tanh-approximated GELU applied to a matrix of features (renamed copy of another record)."""

import torch
import torch.nn as nn
import torch.nn.functional as Fn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        # same computation as 01_gelu_tanh, written by someone else
        return Fn.gelu(features, approximate='tanh')


n_rows = 2048
n_cols = 8192


def get_inputs():
    return [torch.randn(n_rows, n_cols)]


def get_init_inputs():
    return []


KERNELRL = {"category": "elementwise", "sizes": {"cpu": {"n_rows": 9, "n_cols": 300}}}
