"""SFT and RL through accelerate with DDP, DeepSpeed ZeRO-2 and ZeRO-3 on one machine: does each
launch configuration train, checkpoint and resume, and what does each cost (peak GPU memory, step
time; for RL the step split into generation, evaluation and update)?

    python benchmarks/gpu_training.py prepare --tokenizer DIR --work runs/gpu   # model + data
    python benchmarks/gpu_training.py run --work runs/gpu --out OUT [--configs ddp,zero2,zero3]
    python benchmarks/gpu_training.py run ... --device cpu --dry               # CPU rehearsal

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

``run`` writes to OUT: ``results.json`` (every stage's figures and checks), ``results.md`` (the
tables), and ``logs.txt`` (every stage's output). It stops launching stages when its deadline
(``--deadline-s``) would be passed, so what finished is always reported.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SFT_RECIPE = "recipes/gpu/sft_tiny.yaml"
TRAIN_RECIPE = "recipes/gpu/trloo_tiny.yaml"
TASKS = "01_relu,02_gelu_tanh"  # the RL tasks; the SFT data holds their bundled solutions
TINY = {  # SmolLM2-135M is 30 layers of width 576 (intermediate 1536, 9 heads, 3 kv heads)
    "num_hidden_layers": 4,
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
}
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "generation_config.json",
    "config.json",
)


# ---------------------------------------------------------------------- prepare
def copy_tokenizer(source: Path, target: Path) -> None:
    """The files of SmolLM2's HF folder that a tiny model of the same family needs (no weights:
    about 3.5 MB, so they can travel to the GPU machine)."""
    target.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, target / name)
    if not (target / "tokenizer.json").is_file() or not (target / "config.json").is_file():
        raise SystemExit(f"{source}: no tokenizer.json / config.json (not an HF model folder)")


def make_tiny_model(tokenizer_dir: Path, target: Path, seed: int = 0) -> dict[str, Any]:
    """SmolLM2's config with fewer, narrower layers, randomly initialised with ``seed``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(str(tokenizer_dir))
    for key, value in TINY.items():
        setattr(config, key, value)
    config.torch_dtype = "float32"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(target), safe_serialization=True)
    AutoTokenizer.from_pretrained(str(tokenizer_dir)).save_pretrained(str(target))
    params = sum(p.numel() for p in model.parameters())
    return {"model": str(target), "parameters": params, **TINY}


def make_sft_data(target: Path, tasks: str = TASKS) -> int:
    """One SFT row per RL task: the prompt RL uses (same builder, same system message) and the
    bundled solution as the assistant's answer in a fenced block."""
    from types import SimpleNamespace

    import pandas as pd

    from kernelrl.data.bundled import bundled_solution_path
    from kernelrl.launch.train_cli import build_task_dataset

    args = SimpleNamespace(
        tasks=["bundled"],
        task_backend="triton",
        task_filter=tasks,
        task_categories="",
        task_difficulty="",
        max_tasks=None,
        system_prompt="default",
        prompt_template=None,
    )
    rows = []
    for row in build_task_dataset(args):
        solution = bundled_solution_path(row["id"]).read_text()
        rows.append(
            {
                "prompt": list(row["prompt"]),
                "completion": [
                    {"role": "assistant", "content": f"```python\n{solution.strip()}\n```"}
                ],
            }
        )
    target.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(target / "train.parquet")
    return len(rows)


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


# ---------------------------------------------------------------------- run
class GpuMemorySampler:
    """Peak memory used on the whole GPU (trainer and environment children) via nvidia-smi."""

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self.peak_mib: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                out = subprocess.run(
                    ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                    capture_output=True,
                    text=True,
                    timeout=5,
                ).stdout.split()
                used = sum(float(x) for x in out)
                self.peak_mib = used if self.peak_mib is None else max(self.peak_mib, used)
            except (OSError, ValueError, subprocess.SubprocessError):
                return
            self._stop.wait(self.interval_s)

    def __enter__(self) -> GpuMemorySampler:
        if shutil.which("nvidia-smi"):
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=6)


def _last_checkpoint(folder: Path) -> Path | None:
    checkpoints = sorted(folder.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
    return checkpoints[-1] if checkpoints else None


def _log_history(folder: Path) -> list[dict[str, Any]]:
    """The trainer's log history: the summary an SFT run writes, else the last checkpoint's."""
    summary = folder / "sft_summary.json"
    if summary.is_file():
        return json.loads(summary.read_text()).get("log_history", [])
    checkpoint = _last_checkpoint(folder)
    if checkpoint is not None and (checkpoint / "trainer_state.json").is_file():
        return json.loads((checkpoint / "trainer_state.json").read_text()).get("log_history", [])
    return []


def weight_stats(path: Path) -> dict[str, float] | None:
    """Checksum (sum and sum of squares in float64) of every tensor of a saved model."""
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    if not files:
        return None
    total = squares = 0.0
    count = 0
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open is not iterable)
                tensor = handle.get_tensor(key).double()
                total += tensor.sum().item()
                squares += tensor.square().sum().item()
                count += tensor.numel()
    return {"sum": total, "sum_sq": squares, "numel": count}


def weight_change(before: Path, after: Path) -> dict[str, Any] | None:
    """Largest absolute change of any parameter between two saved models, tensor by tensor.
    DeepSpeed saves bf16 weights: the earlier model is rounded to the later one's dtype first,
    so a cast alone never counts as a change (changes below bf16's resolution do not either)."""
    import torch
    from safetensors import safe_open

    old_files = sorted(before.glob("*.safetensors"))
    new_files = sorted(after.glob("*.safetensors"))
    if not old_files or not new_files:
        return None

    def load(files: list[Path]) -> dict[str, torch.Tensor]:
        tensors = {}
        for file in files:
            with safe_open(str(file), framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118 (safe_open is not iterable)
                    tensors[key] = handle.get_tensor(key)
        return tensors

    old, new = load(old_files), load(new_files)
    common = sorted(set(old) & set(new))
    deltas = {
        k: (new[k].float() - old[k].to(new[k].dtype).float()).abs().max().item() for k in common
    }
    return {
        "tensors": len(common),
        "tensors_changed": sum(1 for d in deltas.values() if d > 0),
        "max_abs_change": max(deltas.values(), default=0.0),
        "dtype_before": str(next(iter(old.values())).dtype),
        "dtype_after": str(next(iter(new.values())).dtype),
        "checksum_before": weight_stats(before),
        "checksum_after": weight_stats(after),
    }


class Runner:
    """Launches the stages one after another, each under what is left of the deadline."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = Path(args.work).resolve()
        self.out = Path(args.out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.deadline = time.monotonic() + args.deadline_s
        self.log = open(self.out / "logs.txt", "a", buffering=1)  # noqa: SIM115 (whole run)
        self.results: dict[str, Any] = {"stages": {}, "args": vars(args)}
        self.port = 29500 + (os.getpid() % 1000)
        shutil.rmtree(self.work / "ranks", ignore_errors=True)

    def launch(
        self, stage: str, config: str, command: str, recipe: str, flags: list[str], budget_s: float
    ) -> dict[str, Any]:
        left = self.deadline - time.monotonic()
        if left < budget_s:
            result = {"status": "skipped", "reason": f"{left:.0f} s left, needs ~{budget_s:.0f} s"}
            self.results["stages"][stage] = result
            print(f"== {stage}: skipped ({result['reason']})", flush=True)
            return result
        self.port += 1
        launcher = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            f"recipes/accelerate_configs/{config}.yaml",
            "--num_processes",
            str(self.args.num_processes),
            "--main_process_port",
            str(self.port),
        ]
        if self.args.device == "cpu":
            # DeepSpeed runs on CPU through its CPU accelerator (DS_ACCELERATOR=cpu, gloo);
            # accelerate's --cpu would drop DeepSpeed altogether, and CPU has no bf16 autocast
            launcher += ["--mixed_precision", "no"]
        argv = [
            *launcher,
            str(Path(__file__).resolve()),
            "entry",
            command,
            "--config",
            recipe,
            *flags,
            *self.args.extra,
        ]
        env = dict(
            os.environ, KERNELRL_BENCH_OUT=str(self.work / "ranks"), KERNELRL_BENCH_STAGE=stage
        )
        env.setdefault("PYTHONUNBUFFERED", "1")
        if self.args.device == "cpu":
            env.setdefault("DS_ACCELERATOR", "cpu")
        print(f"== {stage}: {' '.join(argv)}", flush=True)
        self.log.write(f"\n===== {stage}: {' '.join(argv)}\n")
        started = time.monotonic()
        with GpuMemorySampler() as sampler:
            try:
                proc = subprocess.run(
                    argv,
                    cwd=REPO,
                    env=env,
                    stdout=self.log,
                    stderr=subprocess.STDOUT,
                    timeout=max(self.deadline - time.monotonic(), 1),
                )
                code = proc.returncode
            except subprocess.TimeoutExpired:
                code = "timeout"
        wall = time.monotonic() - started
        rank0 = self.work / "ranks" / f"{stage}_rank0.json"
        record = json.loads(rank0.read_text()) if rank0.is_file() else {}
        steps = record.get("step_s", [])
        result = {
            "config": config,
            "command": command,
            "status": "ok" if code == 0 else "failed",
            "exit": code,
            "wall_s": round(wall, 1),
            "global_step": record.get("global_step"),
            "distributed_type": record.get("distributed_type"),
            "zero_stage": record.get("zero_stage"),
            "steps_timed": len(steps),
            "first_step_s": round(steps[0], 3) if steps else None,
            # the first step holds one-off costs (CUDA graphs of the allocator, DeepSpeed's
            # buckets, reference timings of the environment): the median of the others
            "median_step_s": round(_median(steps[1:] or steps), 3) if steps else None,
            "peak_allocated_gib": _round(record.get("peak_allocated_gib")),
            "peak_reserved_gib": _round(record.get("peak_reserved_gib")),
            "peak_rss_gib": _round(record.get("peak_rss_gib")),
            "gpu_used_peak_gib": _round(sampler.peak_mib / 1024 if sampler.peak_mib else None),
        }
        print(f"   {stage}: {result['status']} (exit {code}) in {wall:.0f} s", flush=True)
        if code != 0:
            result["log_tail"] = _tail(self.out / "logs.txt", 25)
            print("\n".join(result["log_tail"]), flush=True)
        self.results["stages"][stage] = result
        return result

    # ------------------------------------------------------------------ stages
    def sft(self, config: str, resume: bool) -> None:
        args = self.args
        stage = f"sft_{config}" + ("_resume" if resume else "")
        folder = self.work / f"sft_{config}"
        flags = [
            "--model_name_or_path",
            str(self.work / "tiny"),
            "--dataset_path",
            str(self.work / "sft_data"),
            "--output_dir",
            str(folder),
        ]
        if args.device == "cpu":
            flags += ["--bf16", "false"]
        steps = self._step_flags(stage, folder, args.sft_steps, args.sft_resume_steps, resume)
        if steps is None:
            return
        flags += steps
        result = self.launch(stage, config, "sft", SFT_RECIPE, flags, args.sft_budget_s)
        if result["status"] == "skipped":
            return
        history = _log_history(folder)
        losses = [(e["step"], e["loss"]) for e in history if "loss" in e and "step" in e]
        result["loss"] = [[s, round(v, 4)] for s, v in losses]
        if resume and losses:
            before = [v for s, v in losses if s <= args.sft_steps]
            after = [v for s, v in losses if s > args.sft_steps]
            first = self.results["stages"].get(f"sft_{config}", {}).get("loss") or []
            result["resumed_from_step"] = args.sft_steps
            result["loss_at_checkpoint"] = (
                first[-1][1] if first else (before[-1] if before else None)
            )
            result["loss_after_resume"] = round(after[0], 4) if after else None
            result["loss_initial"] = first[0][1] if first else None

    def train(self, config: str, resume: bool, init: Path) -> None:
        args = self.args
        stage = f"train_{config}" + ("_resume" if resume else "")
        folder = self.work / f"train_{config}"
        flags = [
            "--model_name_or_path",
            str(init),
            "--output_dir",
            str(folder),
            "--env_device",
            args.device,
            "--task_filter",
            TASKS,
        ]
        if args.device == "cpu":
            flags += ["--bf16", "false"]
        if args.dry:  # the CPU rehearsal checks the glue, not the policy: short turns
            flags += ["--max_completion_length", "48", "--max_feedback_tokens", "32"]
        steps = args.train_steps
        step_flags = self._step_flags(stage, folder, steps, args.train_resume_steps, resume)
        if step_flags is None:
            return
        flags += step_flags
        if resume:
            before = self.work / f"train_{config}_at_{steps}"
            shutil.rmtree(before, ignore_errors=True)
            shutil.copytree(folder, before, ignore=shutil.ignore_patterns("checkpoint-*"))
        result = self.launch(stage, config, "train", TRAIN_RECIPE, flags, args.train_budget_s)
        if result["status"] == "skipped":
            return
        history = [e for e in _log_history(folder) if "reward" in e]
        keys = (
            "step",
            "loss",
            "reward",
            "reward_std",
            "env/correct",
            "env/format_error",
            "turns/mean",
            "advantage/abs_mean",
            "step_time",
            "timing/generation_s",
            "timing/turn_eval_wait_s",
            "timing/reward_wait_s",
            "timing/rollout_and_score_s",
        )
        result["log"] = [{k: _round(e.get(k), 4) for k in keys if k in e} for e in history]
        # steps of this launch only, the first one apart (it holds one-off costs) where others ran
        own = [e for e in history if e.get("step", 0) > (steps if resume else 0)]
        result["breakdown"] = _breakdown(own[1:] or own)
        reference = self.work / f"train_{config}_at_{steps}" if resume else init
        result["weights"] = weight_change(reference, folder)

    def _step_flags(
        self, stage: str, folder: Path, steps: int, resume_steps: int, resume: bool
    ) -> list[str] | None:
        """Step flags of a first run (into an emptied ``folder``), or of a resume from its
        ``checkpoint-<steps>`` for ``resume_steps`` more; None, recorded as not run, when that
        checkpoint is missing."""
        if not resume:
            shutil.rmtree(folder, ignore_errors=True)
            return ["--max_steps", str(steps), "--save_steps", str(steps)]
        checkpoint = folder / f"checkpoint-{steps}"
        if not checkpoint.is_dir():
            self._missing(stage, f"no {checkpoint.name} from {folder.name}")
            return None
        total = str(steps + resume_steps)
        return [
            "--max_steps",
            total,
            "--save_steps",
            total,
            "--resume_from_checkpoint",
            str(checkpoint),
        ]

    def _missing(self, stage: str, reason: str) -> None:
        self.results["stages"][stage] = {"status": "not_run", "reason": reason}
        print(f"== {stage}: not run ({reason})", flush=True)

    def run(self) -> dict[str, Any]:
        configs = [c for c in self.args.configs.split(",") if c]
        # Order: every configuration's first SFT and RL run before any resume, so that a run
        # cut short by the deadline still covers ZeRO-3.
        for config in configs:
            self.sft(config, resume=False)
        # RL starts from the first configuration's SFT model that was saved (DDP's by default)
        saved = [self.work / f"sft_{c}" for c in configs]
        init = next((f for f in saved if (f / "model.safetensors").is_file()), saved[0])
        self.results["rl_init"] = str(init)
        for config in configs:
            self.train(config, resume=False, init=init)
            self.write()
        for config in reversed(configs):  # ZeRO-3 first: the configuration least tried
            self.sft(config, resume=True)
            self.train(config, resume=True, init=init)
            self.write()
        return self.results

    def write(self) -> None:
        (self.out / "results.json").write_text(json.dumps(self.results, indent=1, default=str))
        (self.out / "results.md").write_text(markdown(self.results))


def _breakdown(history: list[dict[str, Any]]) -> dict[str, float | None]:
    """Mean seconds per RL step: generation (all turns), waiting for evaluations (between turns
    and for the rewards), the rest of rollout and scoring, and the update (forward and backward
    of the loss: TRL's step time minus rollout and scoring)."""

    def mean(key: str) -> float | None:
        values = [e[key] for e in history if e.get(key) is not None]
        return round(sum(values) / len(values), 3) if values else None

    step, rollout = mean("step_time"), mean("timing/rollout_and_score_s")
    generation = mean("timing/generation_s")
    evaluation = None
    if mean("timing/turn_eval_wait_s") is not None or mean("timing/reward_wait_s") is not None:
        evaluation = round(
            (mean("timing/turn_eval_wait_s") or 0) + (mean("timing/reward_wait_s") or 0), 3
        )
    update = round(step - rollout, 3) if step is not None and rollout is not None else None
    return {
        "step_s": step,
        "generation_s": generation,
        "evaluation_wait_s": evaluation,
        "rollout_and_score_s": rollout,
        "update_s": update,
    }


def markdown(results: dict[str, Any]) -> str:
    """The tables for benchmarks/README.md."""
    lines = [
        "| stage | launched as | status | steps | wall s | first step s | median step s "
        "| peak alloc GiB (trainer; CPU: peak RSS) | GPU used GiB (all) | check |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, stage in results["stages"].items():
        if stage.get("status") in ("skipped", "not_run"):
            lines.append(
                f"| {name} | | {stage['status']}: {stage.get('reason', '')} | | | | | | | |"
            )
            continue
        lines.append(
            "| {name} | {launch} | {status} | {steps} | {wall} | {first} | {median} | {alloc} | {used} | {check} |".format(
                name=name,
                launch=f"{stage.get('distributed_type')}, ZeRO {stage.get('zero_stage')}",
                status=stage["status"],
                steps=stage.get("global_step"),
                wall=stage.get("wall_s"),
                first=stage.get("first_step_s"),
                median=stage.get("median_step_s"),
                alloc=stage.get("peak_allocated_gib") or stage.get("peak_rss_gib"),
                used=stage.get("gpu_used_peak_gib"),
                check=_check(stage),
            )
        )
    lines += [
        "",
        "| RL stage | step s | generation s | evaluation wait s | rollout+score s | update s |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, stage in results["stages"].items():
        b = stage.get("breakdown")
        if b:
            lines.append(
                f"| {name} | {b['step_s']} | {b['generation_s']} | {b['evaluation_wait_s']} | "
                f"{b['rollout_and_score_s']} | {b['update_s']} |"
            )
    return "\n".join(lines) + "\n"


def _check(stage: dict[str, Any]) -> str:
    if "loss_after_resume" in stage:
        return (
            f"loss {stage.get('loss_initial')} -> {stage.get('loss_at_checkpoint')} (step "
            f"{stage.get('resumed_from_step')}) -> {stage.get('loss_after_resume')} after resume"
        )
    if stage.get("command") == "sft" and stage.get("loss"):
        return f"loss {stage['loss'][0][1]} -> {stage['loss'][-1][1]}"
    if stage.get("command") == "train":
        rewards = [e.get("reward") for e in stage.get("log", [])]
        weights = stage.get("weights") or {}
        return (
            f"rewards {rewards}; tensors changed {weights.get('tensors_changed')}/"
            f"{weights.get('tensors')}, max abs change {_round(weights.get('max_abs_change'), 6)}"
        )
    return ""


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _round(value: Any, digits: int = 3) -> Any:
    return round(value, digits) if isinstance(value, float) else value


def _tail(path: Path, lines: int) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


# ---------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "entry":
        return entry(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    prepare = commands.add_parser("prepare", help="tiny model and SFT data under --work")
    prepare.add_argument(
        "--tokenizer", required=True, help="SmolLM2 HF folder (or its tokenizer files)"
    )
    prepare.add_argument("--work", default="runs/gpu")
    carry = commands.add_parser("carry", help="copy SmolLM2's tokenizer files (no weights) to DIR")
    carry.add_argument("target")
    run = commands.add_parser("run", help="the stages; figures to --out")
    run.add_argument("--work", default="runs/gpu")
    run.add_argument("--out", required=True)
    run.add_argument("--configs", default="ddp,zero2,zero3")
    run.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    run.add_argument("--num_processes", type=int, default=1)
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
    args = parser.parse_args(argv)
    if args.command == "carry":
        from kernelrl.launch.models import resolve_model

        copy_tokenizer(Path(resolve_model("smollm2-135m-instruct")), Path(args.target))
        print(f"tokenizer files in {args.target}")
        return 0
    if args.command == "prepare":
        work = Path(args.work)
        info = make_tiny_model(Path(args.tokenizer), work / "tiny")
        info["sft_rows"] = make_sft_data(work / "sft_data")
        print(json.dumps(info))
        return 0
    if args.dry:
        args.sft_steps, args.sft_resume_steps = min(args.sft_steps, 2), 1
        args.train_steps, args.train_resume_steps = 1, 1
    runner = Runner(args)
    try:
        runner.run()
    finally:
        runner.write()
    stages = runner.results["stages"].values()
    return 0 if all(s.get("status") == "ok" for s in stages) else 1


if __name__ == "__main__":
    sys.exit(main())
