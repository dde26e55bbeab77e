# No kernel: plain tensor arithmetic.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x * (x > 0)
