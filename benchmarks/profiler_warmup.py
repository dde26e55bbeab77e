"""What the first torch.profiler session of a fresh process costs, and whether starting CUPTI
early (as the sandbox child now does before it takes a job) changes kernel timings.

    python benchmarks/profiler_warmup.py --rounds 3

Each round starts two fresh processes: "cold" times three kernels, then opens its first
profiler session; "warm" opens a profiler session first, then times the same kernels. The
order alternates between rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROBE = r"""
import json, sys, time

started = time.perf_counter()
import torch
import triton
import triton.language as tl
from torch.profiler import ProfilerActivity, profile

from kernelrl.env.timing import TimingConfig, time_cuda

torch.zeros(1, device="cuda")
torch.cuda.synchronize()
out = {"import_and_context_s": time.perf_counter() - started}


@triton.jit
def add_one(x, y, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y + offsets, tl.load(x + offsets, mask=mask) + 1, mask=mask)


small = torch.randn(4096, device="cuda")
large = torch.randn(1 << 24, device="cuda")
small_out, large_out = torch.empty_like(small), torch.empty_like(large)
kernels = {
    "triton_small_ms": lambda: add_one[(4,)](small, small_out, small.numel(), BLOCK=1024),
    "torch_small_ms": lambda: torch.add(small, 1),
    "triton_large_ms": lambda: add_one[(large.numel() // 1024,)](large, large_out, large.numel(), BLOCK=1024),
}
for call in kernels.values():
    call()
torch.cuda.synchronize()


def profiler_session() -> float:
    begin = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            kernels["triton_small_ms"]()
        torch.cuda.synchronize()
    list(prof.profiler.kineto_results.events())
    return time.perf_counter() - begin


warm = sys.argv[1] == "warm"
if warm:
    out["first_session_s"] = profiler_session()
for name, call in kernels.items():
    out[name] = time_cuda(call, TimingConfig()).median_ms
if not warm:
    out["first_session_s"] = profiler_session()
out["second_session_s"] = profiler_session()
print(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    probe = Path(tempfile.mkdtemp()) / "profiler_probe.py"  # Triton needs a source file
    probe.write_text(PROBE)
    rows: dict[str, list[dict[str, float]]] = {"cold": [], "warm": []}
    for round_index in range(args.rounds):
        order = ("cold", "warm") if round_index % 2 == 0 else ("warm", "cold")
        for variant in order:
            done = subprocess.run(
                [sys.executable, str(probe), variant], capture_output=True, text=True
            )
            if done.returncode:
                sys.exit(f"{variant} probe failed:\n{done.stderr[-3000:]}")
            rows[variant].append(json.loads(done.stdout.strip().splitlines()[-1]))
    for variant, results in rows.items():
        medians = {key: statistics.median(r[key] for r in results) for key in results[0]}
        print(variant, json.dumps({key: round(value, 4) for key, value in medians.items()}))


if __name__ == "__main__":
    main()
