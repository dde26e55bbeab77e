"""A Triton cache for sandbox children to start from, made once per worker and GPU by a
trusted process running only our code.

A child's Triton cache starts empty (its own, in its scratch directory: one solution's
kernels must never reach another's), so every child used to build Triton's driver utilities
and the audit warm-up kernel's launcher with the host's C compiler, and compile that kernel,
during its warm-up: about 0.7 s of the ~1.2 s its first Triton launch costs on an H100 host
(docs/decisions.md, "Sandbox children start from a seeded Triton cache"), before it can
serve. The seed holds exactly those files; each child gets its own copy (``spawn``), so
nothing a child writes reaches the seed.

    python -m kernelrl.env.sandbox.triton_seed DIR     (CUDA_VISIBLE_DEVICES picks the GPU)
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from kernelrl.env.sandbox.scratch import make_scratch

log = logging.getLogger(__name__)

SEED_TIMEOUT_S = 120.0
_seeds: dict[int, Path | None] = {}
_lock = threading.Lock()


def triton_seed(device: str, gpu_index: int | None) -> Path | None:
    """This worker's seed for a child on ``device`` (made on first use, in its scratch folder); None
    on a CPU (the interpreter compiles nothing) or when it could not be made: children then
    build their own, as before."""
    if device != "cuda":
        return None
    gpu_index = gpu_index or 0
    with _lock:
        if gpu_index not in _seeds:
            _seeds[gpu_index] = _make_seed(gpu_index)
        return _seeds[gpu_index]


def _make_seed(gpu_index: int) -> Path | None:
    folder = make_scratch("triton-seed")
    cache = folder / "triton"
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache), "CUDA_VISIBLE_DEVICES": str(gpu_index)}
    try:
        done = subprocess.run(
            [sys.executable, "-m", __name__, str(cache)],
            env=env,
            capture_output=True,
            text=True,
            timeout=SEED_TIMEOUT_S,
        )
        why = "" if done.returncode == 0 and cache.is_dir() else done.stderr[-2000:]
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = str(exc)
    if why:
        log.warning("no Triton seed for GPU %d, children build their own: %s", gpu_index, why)
        shutil.rmtree(folder, ignore_errors=True)
        return None
    atexit.register(shutil.rmtree, folder, True)
    return cache


def main() -> None:
    """The child's own warm-up launch (``child.warm_up``'s kernel, arguments and audit), so
    the cache holds what a child's warm-up looks up."""
    import torch

    from kernelrl.env.integrity.audit import LaunchCounter
    from kernelrl.env.sandbox.child import warm_up

    if os.environ.get("TRITON_CACHE_DIR") != sys.argv[1]:
        raise SystemExit("TRITON_CACHE_DIR must be the seed's folder")
    warm_up(torch.device("cuda"), LaunchCounter())


if __name__ == "__main__":
    main()
