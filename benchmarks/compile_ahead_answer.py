"""How long a compile companion takes to answer a child's first launch of a kernel, against Triton
compiling the same kernel in the asking process, side by side in one run.

Compiling ahead (``EvalConfig.compile_ahead``, docs/decisions.md) pays only where a child waits
less for its companion than it would spend compiling while not paused. The child's own compile
is fast once its process has compiled before (a GPU child's warm-up has); the companion, a new
process forked for the evaluation, pays what Triton does once per process on top. The kernel is
the bundled ReLU solution's, compiled for an sm_90 target (an H100's or H200's): Triton's
compiler needs no GPU, so this runs on a CPU box.

    python benchmarks/compile_ahead_answer.py --asks 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

TARGET = ("cuda", 90, 32)
SIGNATURE = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n_elements": "i32", "BLOCK_SIZE": "constexpr"}
CONSTANTS = {(3,): 1024}  # paths of arguments, as Triton's launcher gives them
ATTRS = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}
LIMITS = {"file_bytes": 2**30, "cpu_seconds": 300, "address_space_bytes": 16 * 2**30}


def answer_and_compile(asks: int) -> tuple[list[float], list[float]]:
    """Seconds of each companion's answer and of each compile here, one after the other."""
    import triton.compiler
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend

    from kernelrl.data.bundled import bundled_solution_path
    from kernelrl.env.sandbox import harness
    from kernelrl.env.sandbox.protocol import SOLUTION_MODULE

    solution = bundled_solution_path("01_relu", "triton").read_text()
    module = harness.load_module(solution, SOLUTION_MODULE)
    source = ASTSource(module.relu_kernel, SIGNATURE, CONSTANTS, ATTRS)
    target = GPUTarget(*TARGET)
    options = make_backend(target).parse_options({"num_warps": 4}).__dict__
    compile_here, listener = triton.compiler.compile, knobs.compilation.listener
    answers, compiles = [], []
    with tempfile.TemporaryDirectory(prefix="compile-ahead-answer-") as caches:
        for ask in range(asks):
            try:  # the companion's side, installed in this process, undone after each answer
                answers.append(_answer(solution, source, target, options, f"{caches}/answer-{ask}"))
            finally:
                triton.compiler.compile, knobs.compilation.listener = compile_here, listener
            os.environ["TRITON_CACHE_DIR"] = f"{caches}/here-{ask}"
            started = time.perf_counter()
            compile_here(source, target=target, options=options)
            compiles.append(time.perf_counter() - started)
    return answers, compiles


def _answer(solution: str, source: Any, target: Any, options: dict, cache: str) -> float:
    """Seconds from a new companion's being asked for the kernel to its files in ``cache``."""
    from kernelrl.env.sandbox.compile_ahead import CompileAhead
    from kernelrl.env.sandbox.spawn import spawn_companion

    os.environ["TRITON_CACHE_DIR"] = cache
    companion = spawn_companion("cpu", None).result(timeout=120)
    try:
        companion.send({"type": "limits", "limits": LIMITS})
        companion.receive(time.monotonic() + 60)
        ahead = CompileAhead(companion.sock, {})
        ahead.install(solution)
        started = time.perf_counter()
        ahead.ask(source, target, options)
        answered = time.perf_counter() - started
    finally:
        companion.close()
    if ahead.counts["compiled_ahead"] != 1:
        raise SystemExit(f"the companion did not compile the kernel: {ahead.report()}")
    return answered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--asks", type=int, default=5, help="companions asked, one at a time")
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("TRITON_INTERPRET is set: this compiles, unset it")
    answers, compiles = answer_and_compile(args.asks)
    later = answers[1:] or answers  # the first companion of a fork server just started
    print("companion's answer, s: " + " ".join(f"{s:.3f}" for s in answers))
    print("compiled here, s:      " + " ".join(f"{s:.3f}" for s in compiles))
    print(
        f"median of the later answers {statistics.median(later):.3f} s, compiled here "
        f"{statistics.median(compiles):.3f} s: the answer takes "
        f"{statistics.median(later) / statistics.median(compiles):.1f}x the compile"
    )


if __name__ == "__main__":
    main()
