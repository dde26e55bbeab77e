"""What a fresh process pays for its first Triton launch, with an empty Triton cache (as every
sandbox child had) and with one seeded from an earlier process: the C helpers Triton builds
with the host compiler (its driver utilities, a launcher per kernel signature) and the kernel.

    python benchmarks/triton_first_launch.py [--rounds 3] [--children]

Each measurement is its own process (a CUDA context is per process); prints the median of
``--rounds`` for each step and what the seeded cache held. ``--children`` measures sandbox
children instead: their warm-up phases (``child.warm_up``) with the worker's Triton seed
(``env/sandbox/triton_seed.py``) and without, alternated.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROBE = r"""
import json, time, torch, triton, triton.language as tl
seconds = {}
start = time.perf_counter()
torch.cuda.init(); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
seconds["cuda_context"] = time.perf_counter() - start

@triton.jit
def add_one(ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(ptr + offsets, tl.load(ptr + offsets, mask=offsets < n) + 1.0, mask=offsets < n)

start = time.perf_counter()
triton.runtime.driver.active.get_current_target()
seconds["triton_driver"] = time.perf_counter() - start
buffer = torch.zeros(64, device="cuda")
start = time.perf_counter()
add_one[(1,)](buffer, buffer.numel(), BLOCK=64); torch.cuda.synchronize()
seconds["first_launch"] = time.perf_counter() - start
print(json.dumps(seconds))
"""


def probe(cache: Path) -> dict[str, float]:
    script = cache.parent / "probe.py"  # Triton reads a kernel's source from its file
    script.write_text(PROBE)
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache)}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def sandbox_children(rounds: int) -> None:
    from kernelrl.env.sandbox import spawn
    from kernelrl.env.sandbox.processes import ChildPool

    seeded = spawn.triton_seed
    phases = ("cuda_init_seconds", "profiler_init_seconds", "audit_init_seconds")
    runs: dict[str, list[dict[str, float]]] = {"without seed": [], "with seed": []}
    seeded("cuda", 0, None)  # made once per worker, before its first child
    for _ in range(rounds):
        for label, seed in (("without seed", lambda *args: None), ("with seed", seeded)):
            spawn.triton_seed = seed
            pool = ChildPool("cuda", 0, spare=0)
            child = pool.acquire()
            runs[label].append({k: float(child.ready_info[k]) for k in phases})
            child.close()
            pool.close()
    for label, rows in runs.items():
        medians = {k: round(statistics.median(r[k] for r in rows), 3) for k in phases}
        print(f"sandbox child, {label}: {medians}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--children", action="store_true", help="sandbox children instead")
    args = parser.parse_args()
    if args.children:
        sandbox_children(args.rounds)
        return
    root = Path(tempfile.mkdtemp(prefix="triton-first-launch-"))
    try:
        runs: dict[str, list[dict[str, float]]] = {"empty cache": [], "seeded cache": []}
        seed = root / "seed"
        probe(seed)  # fills the seed: what a first process leaves behind
        for index in range(args.rounds):
            runs["empty cache"].append(probe(root / f"empty{index}"))
            seeded = root / f"seeded{index}"
            shutil.copytree(seed, seeded)
            runs["seeded cache"].append(probe(seeded))
        for label, rows in runs.items():
            medians = {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]}
            print(f"{label}: {medians}")
        print("seed holds:", sorted(p.name for p in seed.rglob("*") if p.is_file()))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
