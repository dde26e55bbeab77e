"""The machine a benchmark ran on, recorded beside its figures: the results page gives every
figure with its machine, date and commit, and a benchmark that records them itself needs no
wrapper script per machine to write them down. Also how many GPUs this machine has, which the
benchmarks take as their default where the figure is per host."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def gpu_count() -> int:
    """The GPUs this process may use (``CUDA_VISIBLE_DEVICES`` respected); 0 without CUDA."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_gpus(value: str) -> int:
    """A ``--workers``-style count: a positive number, or ``all`` for every visible GPU."""
    if value == "all":
        count = gpu_count()
        if count == 0:
            raise SystemExit("'all' GPUs asked for, but this machine has no visible GPU")
        return count
    try:
        count = int(value)
    except ValueError:
        raise SystemExit(f"expected a number or 'all', got {value!r}") from None
    if count < 1:
        raise SystemExit(f"expected at least 1, got {count}")
    return count


def describe() -> dict[str, Any]:
    """GPUs, host cores and memory, library versions, the commit and the date, as plain data."""
    import torch

    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _commit(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(gpu_count())],
        "host_cores": len(os.sched_getaffinity(0)),
        "host_memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    return info


def _commit() -> str | None:
    """The checked-out commit, with ``+changes`` when the working tree differs from it; None
    outside a git checkout (a copied tree)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
    except OSError:
        return None
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")
