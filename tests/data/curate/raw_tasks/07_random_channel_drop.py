"""Drops a random channel with Python's unseeded RNG: two runs with equal seeds differ."""

import random

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        channel = random.randrange(x.shape[1])
        mask = torch.ones(x.shape[1], device=x.device)
        mask[channel] = 0.0
        return x * mask.view(1, -1, 1)


batch = 32
channels = 64
length = 1024


def get_inputs():
    return [torch.randn(batch, channels, length)]


def get_init_inputs():
    return []


KERNELRL = {"sizes": {"cpu": {"batch": 2, "channels": 64, "length": 33}}}
