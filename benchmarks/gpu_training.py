"""SFT and RL through accelerate with DDP, DeepSpeed ZeRO-2 and ZeRO-3 on one machine: does each
launch configuration train, checkpoint and resume, and what does each cost (peak GPU memory, step
time; for RL the step split into generation, evaluation and update)?

    python benchmarks/gpu_training.py run --tokenizer DIR --out OUT [--configs ddp,zero2,zero3]
    python benchmarks/gpu_training.py run --tokenizer DIR --out OUT --device cpu --dry   # CPU rehearsal
    python benchmarks/gpu_training.py carry DIR    # SmolLM2's tokenizer files (no weights) to DIR

``run --tokenizer`` first builds the tiny model and its SFT data under ``--work`` (``prepare``
alone does only that); without it, ``run`` uses what an earlier ``prepare`` left there. One
process per GPU of the machine unless ``--num_processes`` says otherwise. Needs accelerate and,
for ZeRO, DeepSpeed (built without its ops, ``DS_BUILD_OPS=0``, against the machine's torch).

Every stage is the user's command, ``accelerate launch --config_file
recipes/accelerate_configs/<cfg>.yaml --num_processes N -m kernelrl.launch.cli sft|train
--config recipes/gpu/...``, except that accelerate starts this file (``entry``), which adds one
``TrainerCallback`` (step times, peak ``torch.cuda.max_memory_allocated`` of the process) to
transformers' default callbacks and then calls ``kernelrl.launch.cli.main`` unchanged.

The policy is a tiny Llama with SmolLM2-135M's tokenizer and architecture but 4 layers of width
256, randomly initialised (seed 0): the real SmolLM2 (a 98 MB GGUF, 270 MB in bf16) does not fit
in the 64 MiB that travels to the GPU machine. A random policy never writes a parseable kernel,
so every reward would be 0 and no advantage would move the weights; the SFT stage therefore
memorises the bundled solutions of the RL tasks first (``prepare`` writes them as an SFT
dataset with the RL prompts), and RL starts from that checkpoint: its samples parse, compile and
run often enough for rewards to differ within a group.

``run`` writes to OUT: ``results.json`` (every stage's figures and checks, the machine and the
library versions), ``results.md`` (the tables), and ``logs.txt`` (every stage's output). It stops
launching stages when its deadline (``--deadline-s``) would be passed, so what finished is always
reported.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_training_prepare import copy_tokenizer, make_sft_data, make_tiny_model  # noqa: E402
from gpu_training_runner import Runner  # noqa: E402
from machine import describe, gpu_count  # noqa: E402

LIBRARIES = ("torch", "transformers", "accelerate", "trl", "deepspeed", "datasets", "peft")


# ---------------------------------------------------------------------- entry (inside accelerate)
def entry(argv: list[str]) -> int:
    """Run ``kernelrl.launch.cli`` with a callback that records step times and peak memory to
    ``$KERNELRL_BENCH_OUT/<stage>_rank<r>.json`` (also at exit, so a crash keeps its figures)."""
    import torch
    import transformers.trainer
    from transformers import TrainerCallback

    from kernelrl.launch.cli import main

    record: dict[str, Any] = {"step_s": [], "global_step": 0}
    rank = int(os.environ.get("RANK", "0"))
    path = (
        Path(os.environ["KERNELRL_BENCH_OUT"])
        / f"{os.environ['KERNELRL_BENCH_STAGE']}_rank{rank}.json"
    )
    cuda = torch.cuda.is_available()

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def dump() -> None:
        if cuda:
            record["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
            record["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
            record["device"] = torch.cuda.get_device_name()
        else:
            import resource

            record["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
            record["device"] = "cpu"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1))

    class BenchCallback(TrainerCallback):
        """Wall time of each optimizer step (generation and scoring included for RL)."""

        def on_step_begin(self, args, state, control, **kwargs):
            sync()
            self._started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            sync()
            record["step_s"].append(time.perf_counter() - self._started)
            record["global_step"] = state.global_step

        def on_train_begin(self, args, state, control, **kwargs):
            from accelerate.state import AcceleratorState

            accelerator = AcceleratorState()
            record["distributed_type"] = getattr(
                accelerator.distributed_type, "value", str(accelerator.distributed_type)
            )
            record["num_processes"] = accelerator.num_processes
            plugin = accelerator.deepspeed_plugin
            record["zero_stage"] = plugin.zero_stage if plugin is not None else None

        def on_train_end(self, args, state, control, **kwargs):
            record["global_step"] = state.global_step
            dump()

    transformers.trainer.DEFAULT_CALLBACKS.append(BenchCallback)
    atexit.register(dump)
    return main(argv)


def prepare(tokenizer: Path, work: Path) -> dict[str, Any]:
    """The tiny model and its SFT data under ``work``."""
    info = make_tiny_model(tokenizer, work / "tiny")
    info["sft_rows"] = make_sft_data(work / "sft_data")
    print(json.dumps(info), flush=True)
    return info


def versions() -> dict[str, str]:
    """The training libraries' versions, or why one does not import (the stages then say what
    broke)."""
    found = {}
    for name in LIBRARIES:
        try:
            found[name] = importlib.import_module(name).__version__
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            found[name] = f"{type(exc).__name__}: {exc}"[:200]
    return found


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    prep = commands.add_parser("prepare", help="tiny model and SFT data under --work")
    prep.add_argument(
        "--tokenizer", required=True, help="SmolLM2 HF folder (or its tokenizer files)"
    )
    prep.add_argument("--work", default="runs/gpu")
    carry = commands.add_parser("carry", help="copy SmolLM2's tokenizer files (no weights) to DIR")
    carry.add_argument("target")
    run = commands.add_parser("run", help="the stages; figures to --out")
    run.add_argument("--tokenizer", default="", help="prepare --work from this folder first")
    run.add_argument("--work", default="runs/gpu")
    run.add_argument("--out", required=True)
    run.add_argument("--configs", default="ddp,zero2,zero3")
    run.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    run.add_argument(
        "--num_processes", type=int, default=0, help="ranks (0: one per GPU; 1 on CPU)"
    )
    run.add_argument("--deadline-s", type=float, default=480)
    run.add_argument("--sft-steps", type=int, default=200)
    run.add_argument("--sft-resume-steps", type=int, default=10)
    run.add_argument("--train-steps", type=int, default=2)
    run.add_argument("--train-resume-steps", type=int, default=1)
    run.add_argument(
        "--sft-budget-s", type=float, default=25, help="skip an SFT stage with less left"
    )
    run.add_argument(
        "--train-budget-s", type=float, default=45, help="skip an RL stage with less left"
    )
    run.add_argument("--dry", action="store_true", help="CPU rehearsal: fewest steps")
    run.add_argument("extra", nargs="*", help="more recipe flags for every stage (after --)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "entry":
        return entry(argv[1:])
    args = parse_args(argv)
    if args.command == "carry":
        from kernelrl.launch.models import resolve_model

        copy_tokenizer(Path(resolve_model("smollm2-135m-instruct")), Path(args.target))
        print(f"tokenizer files in {args.target}")
        return 0
    if args.command == "prepare":
        prepare(Path(args.tokenizer), Path(args.work))
        return 0
    started = time.monotonic()
    if args.tokenizer:
        prepare(Path(args.tokenizer), Path(args.work))
        args.deadline_s -= time.monotonic() - started  # the deadline bounds the whole command
    if args.num_processes <= 0:
        args.num_processes = max(gpu_count(), 1) if args.device == "cuda" else 1
    if args.dry:
        args.sft_steps, args.sft_resume_steps = min(args.sft_steps, 2), 1
        args.train_steps, args.train_resume_steps = 1, 1
    runner = Runner(args)
    try:
        runner.run()
    finally:  # after the stages: this process opens no GPU while they run
        runner.results["machine"] = {**describe(), "versions": versions()}
        runner.write()
    stages = runner.results["stages"].values()
    return 0 if all(s.get("status") == "ok" for s in stages) else 1


if __name__ == "__main__":
    sys.exit(main())
