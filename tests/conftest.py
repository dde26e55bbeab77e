"""Test configuration: GPU tests are skipped where no CUDA device is visible."""

from __future__ import annotations

import os

import pytest
import torch

# Reference timings go to a per-session cache, never to the user's ~/.cache.
os.environ.setdefault(
    "KERNELRL_CACHE", os.path.join(os.environ.get("TMPDIR", "/tmp"), "kernelrl-test-cache")
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
