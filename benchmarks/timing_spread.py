"""How much a kernel's measured time varies between fresh processes, and what steadies it.

    python benchmarks/timing_spread.py --processes 6 --tasks 11_rmsnorm 13_l2_normalize

The evaluator times every solution in a fresh sandbox process, once, while the reference's
timing is measured once per task and device and then cached; a speedup therefore moves with
whatever makes one process's kernel slower than another's. This runs ``--processes`` fresh
processes one after another (the GPU to each in turn); each loads the listed tasks and their
bundled Triton solutions and times solution and eager reference with ``time_cuda`` on one
input set (``sets=1``) and on K input sets allocated side by side, the timed calls rotating
over them (``sets=K``). It prints, per task and way, max/min over processes of the solution's
median, the reference's median and their ratio (the speedup).

What else may be on the GPU meanwhile, as in a pool: ``--neighbours`` idle processes holding a
CUDA context and scattered memory; ``--busy`` processes running large matmuls, resumed for
half a second before each timing and paused (SIGSTOP, 50 ms settle) while it runs, as the
evaluator pauses the other sandboxes of its GPU; ``--prelude``: the measured process first
runs 3 other input sets and keeps them, as a sandbox child does for its correctness checks;
``--cupti``: it starts CUPTI first, as a sandbox child does; ``--churn``: beside each measured
process another holds a random pattern of GPU memory, a new one per process, so that each gets
other physical memory (what a pool's other sandboxes do); ``--forked``: every measured process
is forked from one process that imported torch, Triton and the sandbox child's code without a
CUDA context, as a pool's children are forked from its fork server (``sandbox.zygote``), rather
than started afresh: whether a draw is one of the process or one its siblings share.
``sets=Kp`` rows time each of the K
sets on its own and average their medians, as the evaluator does; the other ``sets=K*`` rows
time the same sets in reverse order, with new contents before every call, with each set's
outputs in memory of their own, or with its outputs and the model's parameters
(``PLACED_WAYS``), and each set's place by index is printed after them.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


NEIGHBOUR = """
import signal, sys, torch
blocks = [torch.empty(32 << 20, dtype=torch.uint8, device="cuda") for _ in range(48)]
del blocks[::2]  # freed every other block: the driver's memory is left in pieces
torch.cuda.empty_cache()
print("ready", flush=True)
signal.pause()
"""
CHURN = """
import random, signal, sys, torch
random.seed(int(sys.argv[1]))
count = random.randint(20, 120)
blocks = [torch.empty(random.randint(1, 32) << 21, dtype=torch.uint8, device="cuda") for _ in range(count)]
random.shuffle(blocks)
del blocks[: count // 2]
torch.cuda.empty_cache()
print("ready", flush=True)
signal.pause()
"""
BUSY = """
import torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print("ready", flush=True)
while True:
    a @ a
    torch.cuda.synchronize()
"""


def start_cupti() -> None:
    """CUPTI started, as a sandbox child starts it before it takes a job."""
    import torch

    from kernelrl.env.integrity.audit import LaunchCounter
    from kernelrl.env.sandbox.child import warm_up

    warm_up(torch.device("cuda"), LaunchCounter())


def sm_mhz() -> float:
    import torch

    try:
        return float(torch.cuda.clock_rate())
    except Exception:  # no NVML bindings here
        return float("nan")


def measure(
    task_ids: list[str],
    set_counts: list[int],
    prelude: bool,
    gated: bool,
    warmup_ms: float,
    cupti: bool,
    ways: list[str],
) -> dict[str, dict[str, float | list[float]]]:
    """One process's medians (ms): {task: {"sol@K": ms, "ref@K": ms, "sol@Kp:sets": each
    set's}}. ``prelude``: first run the solution on 3 other input sets and keep inputs and
    outputs, as a sandbox child does for its correctness checks before it is timed."""
    import torch

    from kernelrl.env.sandbox import harness
    from kernelrl.env.task import load_task
    from kernelrl.env.timing import TimingConfig, time_cuda

    config = TimingConfig(warmup_ms=warmup_ms)
    if cupti:
        start_cupti()
    device = torch.device("cuda")
    medians: dict[str, dict[str, float | list[float]]] = {}
    for task_id in task_ids:
        task = load_task(ROOT / "data" / "tasks" / f"{task_id}.py")
        solution = (ROOT / "data" / "solutions" / "triton" / f"{task_id}.py").read_text()
        reference = harness.load_module(task.source, f"ref_{task_id}")
        candidate = harness.load_module(solution, f"sol_{task_id}")
        models = {
            "ref": harness.build_model(reference.Model, reference, 0, device),
            "sol": harness.build_model(candidate.ModelNew, reference, 0, device),
        }
        # way "k": the solution's kernels loaded anew for each set (the reference's stay)
        anew = {
            "sol": partial(loaded_anew, solution, task_id, reference, models["sol"]),
            "ref": None,
        }
        medians[task_id] = {}
        kept = []
        if prelude:
            with torch.no_grad():
                for seed in (101, 102, 103):
                    inputs = harness.make_inputs(reference, seed, device)
                    output = models["sol"](*inputs)
                    kept.append((inputs, output, output.clone()))

        def make(seed: int, reference=reference) -> list:
            return harness.make_inputs(reference, seed, device)

        for sets in set_counts:
            inputs = [make(1 + i) for i in range(sets)]
            for name, model in models.items():
                turn = iter(range(1 << 62))

                def call(model=model, inputs=inputs, turn=turn) -> None:
                    with torch.no_grad():
                        model(*inputs[next(turn) % len(inputs)])

                if gated:  # the parent pauses its busy neighbours, then says go
                    print("ready", flush=True)
                    sys.stdin.readline()
                medians[task_id][f"{name}@{sets}:mhz"] = sm_mhz()
                medians[task_id][f"{name}@{sets}"] = time_cuda(call, config).median_ms
                if sets > 1:  # each set timed on its own: the mean of K placements
                    for way in [w for w in ways if w != "i"]:
                        each = placed_medians(model, inputs, way, config, make, anew[name])
                        medians[task_id][f"{name}@{sets}{way}"] = sum(each) / len(each)
                        medians[task_id][f"{name}@{sets}{way}:sets"] = each
            if sets > 1 and "i" in ways:
                for name, each in interleaved_medians(models, inputs, config).items():
                    medians[task_id][f"{name}@{sets}i"] = sum(each) / len(each)
                    medians[task_id][f"{name}@{sets}i:sets"] = each
            del inputs
        del kept
        torch.cuda.empty_cache()
    return medians


# How each of K input sets is timed on its own, their medians averaged: "p" in order, the call's
# outputs and the model's parameters where they happen to be; "r" the same sets timed in the
# reverse order (whether a slow set is slow for its memory or for its turn); "e" as a sandbox
# child does, each set given new contents before every call (``harness.TimedInputs``); "o" with
# each set's outputs in memory of its own (one output of every set timed before is kept, so the
# next set's calls cannot be given the same blocks); "w" with its parameters too (copied to new
# memory before the set, the earlier copies kept); "g" as "w", each parameter's copy starting a
# 2 MiB page of its own (small copies from the allocator's small pool share their pages, so "w"
# leaves a small weight on the pages it had); "k" with the solution's kernels compiled and
# loaded anew for every set (its source given a distinct comment, as a new kernel's is in the
# throughput benchmark), the parameters where they were: whether the process's draw is where its
# kernels' code lies (the reference's kernels stay as they are); "i" the solution's and the
# reference's sets in turn, set by set (solution on set 0, reference on set 0, solution on set 1,
# ...), as the evaluator interleaves them when it times the reference in every evaluation
# (``env/side_by_side.py``): whether a state of the machine that moves both divides out of the
# speedup when they are timed side by side; "l" with the context's local memory (where a kernel's
# spilled registers live: allocated once per context, so one placement for every set of a
# process) given up and allocated anew before every set: whether the draw is where the spills go.
PLACED_WAYS = ("p", "r", "e", "o", "w", "g", "k", "i", "l")
PAGE_BYTES = 2 << 20


def loaded_anew(solution: str, task_id: str, reference, model, label: str):
    """``model`` again, its class and kernels from ``solution`` compiled and loaded anew under
    ``label``, its parameters and buffers the same tensors as ``model``'s."""
    from env_throughput import distinct_source

    from kernelrl.env.sandbox import harness

    module = harness.load_module(distinct_source(solution, label), f"sol_{task_id}_{label}")
    fresh = harness.build_model(module.ModelNew, reference, 0, next(model.parameters()).device)
    params = zip(fresh.parameters(), model.parameters(), strict=True)
    buffers = zip(fresh.buffers(), model.buffers(), strict=True)
    for mine, theirs in [*params, *buffers]:
        mine.data = theirs.data
    return fresh


def on_own_page(tensor):
    """A copy of ``tensor`` at the start of a block a page longer than it: the block stays
    alive with the copy, so no later copy can share its page."""
    import torch

    nbytes = tensor.numel() * tensor.element_size()
    block = torch.empty(nbytes + PAGE_BYTES, dtype=torch.uint8, device=tensor.device)
    copy = block[:nbytes].view(tensor.dtype).view(tensor.shape)
    copy.copy_(tensor)
    return copy


def interleaved_medians(models: dict, inputs: list, config) -> dict[str, list[float]]:
    """Way "i": each set's median for the solution and then the reference, set by set, so the
    two medians of a set are measured a moment apart."""
    from kernelrl.env.sandbox import harness
    from kernelrl.env.timing import time_cuda

    medians = {name: [0.0] * len(inputs) for name in ("sol", "ref")}
    for index in range(len(inputs)):
        for name in ("sol", "ref"):
            call = harness.forward_call(models[name], inputs, index)
            medians[name][index] = time_cuda(call, config).median_ms
    return medians


def placed_medians(model, inputs: list, way: str, config, make, anew=None) -> list[float]:
    """Each set's median, by set index, each set placed and timed as ``way`` says; ``make(seed)``
    makes one input set (way "e" makes its own sets with it); ``anew(label)``: the model with
    its kernels loaded anew (way "k"; None for the reference)."""
    import torch

    from kernelrl.env.sandbox import harness
    from kernelrl.env.sandbox.local_memory import move_local_memory
    from kernelrl.env.timing import time_cuda

    kept: list = []
    timed = harness.TimedInputs(make, 11, len(inputs)) if way == "e" else None
    sets = timed.sets if timed is not None else inputs
    order = range(len(sets) - 1, -1, -1) if way == "r" else range(len(sets))
    medians = [0.0] * len(sets)
    for index in order:
        if way in ("w", "g"):
            for tensor in [*model.parameters(), *model.buffers()]:
                kept.append(tensor.data)
                tensor.data = tensor.data.clone() if way == "w" else on_own_page(tensor.data)
        if way == "l":  # a block growing by set, so that each replacement lands elsewhere
            move_local_memory(kept, (index + 1) << 24)
        if way == "k" and anew is not None:
            model = anew(f"set {index}")
            kept.append(model)  # its kernels' module stays loaded, so the next is put elsewhere
        call = harness.forward_call(model, sets, index)
        prepare = (lambda index=index: timed.refresh(index)) if timed is not None else None
        medians[index] = time_cuda(call, config, prepare=prepare).median_ms
        if way in ("o", "w", "g"):
            with torch.no_grad():
                kept.append(model(*sets[index]))
    return medians


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, default=6)
    parser.add_argument("--tasks", nargs="+", default=["11_rmsnorm", "01_relu"])
    parser.add_argument("--sets", nargs="+", type=int, default=[1, 3])
    parser.add_argument(
        "--neighbours",
        type=int,
        default=0,
        help="idle processes holding a CUDA context and scattered GPU memory meanwhile",
    )
    parser.add_argument(
        "--prelude", action="store_true", help="run and keep 3 input sets before timing"
    )
    parser.add_argument("--busy", type=int, default=0, help="matmul processes, paused to time")
    parser.add_argument(
        "--churn",
        action="store_true",
        help="beside each measured process, another holding a random pattern of GPU memory",
    )
    parser.add_argument("--warmup-ms", type=float, default=25.0)
    parser.add_argument("--cupti", action="store_true", help="start CUPTI before timing")
    parser.add_argument(
        "--ways",
        nargs="+",
        choices=PLACED_WAYS,
        default=list(PLACED_WAYS),
        help="how the K sets are placed and timed one by one (see PLACED_WAYS)",
    )
    parser.add_argument(
        "--forked",
        action="store_true",
        help="fork the measured processes from one that imported torch and Triton, as a pool does",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fork-parent", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.child:
        measure_and_print(args)
        return
    if args.fork_parent:
        fork_measured(args)
        return
    print_spreads(args, run_processes(args))


def measure_and_print(args: argparse.Namespace) -> None:
    medians = measure(
        args.tasks, args.sets, args.prelude, args.busy > 0, args.warmup_ms, args.cupti, args.ways
    )
    print(json.dumps(medians), flush=True)


def fork_measured(args: argparse.Namespace) -> None:
    """The fork parent: imports what a pool's fork server does, never touches the GPU, and
    forks one measured process for every ``next`` line, saying ``done <exit code>`` after each
    (the process reads the ``go`` lines of a gated timing from the same stdin meanwhile)."""
    import warnings

    warnings.filterwarnings("ignore", message=".*multi-threaded.*fork", category=DeprecationWarning)
    from kernelrl.env.sandbox import child  # noqa: F401 - torch, Triton, the harness
    from kernelrl.env.sandbox.zygote import PRELOADED

    for name in PRELOADED:
        importlib.import_module(name)
    while sys.stdin.readline().strip() == "next":
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                measure_and_print(args)
                code = 0
            finally:
                sys.stdout.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(f"done {os.waitstatus_to_exitcode(status)}", flush=True)


def _start(source: str, *argv: str) -> subprocess.Popen:
    """A helper process (neighbour, busy or churn), once it says it is ready."""
    command = [sys.executable, "-c", source, *argv]
    process = subprocess.Popen(command, stdout=subprocess.PIPE)
    process.stdout.readline()  # "ready"
    return process


def run_processes(args: argparse.Namespace) -> list[dict]:
    """The measured processes one after another, with what ``args`` puts around them; each
    one's medians."""
    neighbours = [_start(NEIGHBOUR) for _ in range(args.neighbours)]
    busy = [_start(BUSY) for _ in range(args.busy)]
    for process in busy:
        os.kill(process.pid, signal.SIGSTOP)
    command = [sys.executable, __file__, "--tasks", *args.tasks, "--sets"]
    command += [str(k) for k in args.sets] + (["--prelude"] if args.prelude else [])
    command += ["--busy", str(args.busy), "--warmup-ms", str(args.warmup_ms)]
    command += ["--cupti"] if args.cupti else []
    command += ["--ways", *args.ways]
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE}
    parent = subprocess.Popen([*command, "--fork-parent"], **pipes) if args.forked else None
    runs = []
    try:
        for index in range(args.processes):
            churn = _start(CHURN, str(index)) if args.churn else None
            if parent is None:
                measured = subprocess.Popen([*command, "--child"], **pipes)
            else:
                measured = parent
                parent.stdin.write(b"next\n")
                parent.stdin.flush()
            code = None
            for line in measured.stdout:
                if line.startswith(b"done "):  # a forked process ended
                    code = int(line.split()[1])
                    break
                if line.strip() != b"ready":
                    runs.append(json.loads(line))
                    continue
                for process in busy:
                    os.kill(process.pid, signal.SIGCONT)
                time.sleep(0.5)
                for process in busy:
                    os.kill(process.pid, signal.SIGSTOP)
                time.sleep(0.05)
                measured.stdin.write(b"go\n")
                measured.stdin.flush()
            if (code if parent is not None else measured.wait()) != 0:
                raise RuntimeError(f"measuring process {index} failed")
            if churn is not None:
                churn.kill()
                churn.wait()
            print(f"process {index}: {runs[-1]}", flush=True)
    finally:
        for process in neighbours + busy + ([parent] if parent else []):
            process.kill()
    return runs


def print_spreads(args: argparse.Namespace, runs: list[dict]) -> None:
    """Max/min over the processes of each task's solution, reference and speedup."""
    print(
        f"\nmax/min over {args.processes} {'forked' if args.forked else 'fresh'} processes"
        " (medians in ms), neighbours:"
        f" {args.neighbours}, busy: {args.busy}, prelude: {args.prelude},"
        f" warm-up {args.warmup_ms:g} ms, CUPTI started: {args.cupti}, churn: {args.churn}"
        " (sets=Kp: mean of K sets timed one by one; Kr: in reverse order; Ke: new contents"
        " before every call; Ko: each set's outputs in their own memory; Kw: its outputs and"
        " parameters; Kg: its parameters each on pages of their own; Kk: its kernels loaded"
        " anew; Ki: the solution's and the reference's sets in turn; Kl: the local memory"
        " moved before every set):"
    )
    print(f"{'task':<24} {'sets':>4} {'solution':>9} {'reference':>9} {'speedup':>8}")
    for task_id in args.tasks:
        placed = [f"{k}{way}" for k in args.sets if k > 1 for way in args.ways]
        for way in [f"{k}" for k in args.sets] + placed:
            sol = [run[task_id][f"sol@{way}"] for run in runs]
            ref = [run[task_id][f"ref@{way}"] for run in runs]
            speedup = [r / s for r, s in zip(ref, sol, strict=True)]
            spreads = [max(v) / min(v) for v in (sol, ref, speedup)]
            print(f"{task_id:<24} {way:>4} " + " ".join(f"{x:>9.3f}" for x in spreads))
    print_set_positions(args, runs)


def print_set_positions(args: argparse.Namespace, runs: list[dict]) -> None:
    """Each input set's median over its process's mean, averaged over the processes, by set
    index (the order they were allocated in), and how often each set was the slowest: a set
    slow for where it lies stays slow when timed in another turn (way "r")."""
    print("\nthe solution's sets by index: mean of median / the process's mean; times slowest")
    for task_id in args.tasks:
        for sets in [k for k in args.sets if k > 1]:
            for way in args.ways:
                each = [run[task_id][f"sol@{sets}{way}:sets"] for run in runs]
                means = [
                    sum(m[i] / (sum(m) / len(m)) for m in each) / len(each) for i in range(sets)
                ]
                slowest = [sum(1 for m in each if m.index(max(m)) == i) for i in range(sets)]
                print(
                    f"{task_id:<24} {sets}{way}  "
                    + " ".join(f"{x:.4f}" for x in means)
                    + "   slowest "
                    + " ".join(str(n) for n in slowest)
                )


if __name__ == "__main__":
    main()
