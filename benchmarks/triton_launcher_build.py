"""What a fresh process's first Triton launches spend, part by part: Triton's driver utilities,
each kernel's compile, and each signature's launcher (a C module the host's compiler builds;
Triton 3.6 builds one per signature, 3.9 none). Three kernels in one process with an empty cache,
as a sandbox child's is apart from its seed: the first pays the utilities too, the second has a
new signature, the third the second's signature and another body (its launcher is found).
What it measures is what ``env/sandbox/triton_launchers.py`` takes off an evaluation's first call.

    python benchmarks/triton_launcher_build.py        (on a GPU)
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="launcher-build-")

import torch  # noqa: E402 - after the cache is chosen
import triton  # noqa: E402
import triton.compiler  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.nvidia import driver  # noqa: E402

spent: list[tuple[str, float]] = []


def timed(name_of: Callable[..., str], work: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return work(*args, **kwargs)
        finally:
            spent.append((name_of(*args, **kwargs), time.perf_counter() - started))

    return run


@triton.jit
def add(x, y, out, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + i, tl.load(x + i, mask=i < n) + tl.load(y + i, mask=i < n), mask=i < n)


@triton.jit
def scale(x, out, n, factor, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + i, tl.load(x + i, mask=i < n) * factor, mask=i < n)


@triton.jit
def scale_shift(x, out, n, factor, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + i, tl.load(x + i, mask=i < n) * factor + 1.0, mask=i < n)


def main() -> None:
    driver.compile_module_from_src = timed(
        lambda *a, **k: k.get("name", "module"), driver.compile_module_from_src
    )
    triton.compiler.compile = timed(lambda *a, **k: "kernel compile", triton.compiler.compile)
    x = torch.randn(4096, device="cuda")
    y, out = torch.randn_like(x), torch.empty_like(x)
    launches = {
        "add (the first: Triton's utilities too)": lambda: add[(4,)](x, y, out, 4096, BLOCK=1024),
        "scale (a new signature)": lambda: scale[(4,)](x, out, 4096, 2.0, BLOCK=1024),
        "scale_shift (scale's signature)": lambda: scale_shift[(4,)](x, out, 4096, 2.0, BLOCK=1024),
    }
    for name, launch in launches.items():
        spent.clear()
        started = time.perf_counter()
        launch()
        torch.cuda.synchronize()
        parts = ", ".join(f"{part} {seconds:.3f}" for part, seconds in spent)
        print(f"{name}: {time.perf_counter() - started:.3f} s; {parts}")


if __name__ == "__main__":
    main()
