"""The trusted side's GPU time to compare one output, PyTorch ops against the fused kernels
(``env/compare_kernels.py``), side by side in one run.

An output arrives in chunks of the device ring's slot and is compared chunk by chunk
(``OutputMatcher.add_chunk``); with its last chunk comes the reference's degenerate-answer
statistics (``information.degenerate_errors``). Both run under the worker's GPU lock, so this
time is time every other evaluation's measurement and comparison waits. The default shape is
KernelBench level 1's published elementwise size (4096 x 393216 float32, 6.4 GB).

    python benchmarks/compare_cost.py --shape 4096 393216 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from kernelrl.env import compare_kernels
from kernelrl.env.compare import OutputMatcher, describe_outputs
from kernelrl.env.sandbox.device_ring import SLOT_BYTES
from kernelrl.env.task import task_from_source

TASK = """
import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return x
def get_inputs():
    return [torch.randn(4)]
def get_init_inputs():
    return []
"""


def compare_once(ref: torch.Tensor, out: torch.Tensor, slot_bytes: int) -> tuple[float, bool]:
    """Seconds to compare ``out`` with ``ref`` in slot-sized chunks, statistics included."""
    matcher = OutputMatcher(task_from_source(TASK, "compare_cost"), [ref], 0)
    matcher.check_description(describe_outputs([out]))
    flat = out.reshape(-1)
    step = slot_bytes // out.element_size()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for start in range(0, flat.numel(), step):
        matcher.add_chunk(0, flat[start : start + step])
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    return seconds, matcher.finish().correct


def timed(arm: Callable[[], tuple[float, bool]], repeats: int) -> dict[str, object]:
    runs = [arm() for _ in range(repeats + 1)][1:]  # the first compiles (kernels) or warms
    return {
        "seconds": [s for s, _ in runs],
        "median_s": statistics.median(s for s, _ in runs),
        "correct": all(c for _, c in runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", type=int, nargs="+", default=[4096, 393216])
    parser.add_argument(
        "--dtype", default="float32", choices=["float32", "float16", "bfloat16", "float64"]
    )
    parser.add_argument("--slot-mib", type=int, default=SLOT_BYTES // 2**20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json-out")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU: it times the comparison on one")
    dtype = getattr(torch, args.dtype)
    ref = torch.randn(*args.shape, device="cuda").to(dtype)
    out = (ref.float() + 1e-7 * torch.randn_like(ref, dtype=torch.float32)).to(dtype)
    slot = args.slot_mib * 2**20
    fused = compare_kernels.fused
    arms = {}
    for name in ("pytorch", "fused", "pytorch_again", "fused_again"):
        compare_kernels.fused = fused if name.startswith("fused") else (lambda *t: False)
        arms[name] = timed(lambda: compare_once(ref, out, slot), args.repeats)
        print(f"{name:14s} median {arms[name]['median_s']:.3f} s  correct {arms[name]['correct']}")
    compare_kernels.fused = fused
    pytorch = statistics.median(arms["pytorch"]["seconds"] + arms["pytorch_again"]["seconds"])
    fast = statistics.median(arms["fused"]["seconds"] + arms["fused_again"]["seconds"])
    summary = {
        "device": torch.cuda.get_device_name(),
        "shape": args.shape,
        "dtype": args.dtype,
        "slot_mib": args.slot_mib,
        "arms": arms,
        "pytorch_median_s": pytorch,
        "fused_median_s": fast,
        "ratio": pytorch / fast,
    }
    print(
        f"one {tuple(args.shape)} {args.dtype} output: PyTorch ops {pytorch:.3f} s, "
        f"fused kernels {fast:.3f} s, ratio {pytorch / fast:.1f}x"
    )
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
