"""Runs the GPU training benchmark's stages one after another: per launch configuration SFT and
RL, each resumed from its checkpoint, every stage the user's ``accelerate launch`` command under
what is left of the deadline, with the whole GPU's memory sampled meanwhile."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_training_prepare import REPO, SFT_RECIPE, TASKS, TRAIN_RECIPE  # noqa: E402
from gpu_training_report import (  # noqa: E402
    _breakdown,
    _median,
    _round,
    _tail,
    markdown,
    weight_change,
)

# the file accelerate starts for every stage (its ``entry`` command)
ENTRY_SCRIPT = Path(__file__).resolve().with_name("gpu_training.py")


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
        argv, env = self._command(stage, config, command, recipe, flags)
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
        result = self._result(stage, config, command, code, wall, sampler.peak_mib)
        print(f"   {stage}: {result['status']} (exit {code}) in {wall:.0f} s", flush=True)
        if code != 0:
            result["log_tail"] = _tail(self.out / "logs.txt", 25)
            print("\n".join(result["log_tail"]), flush=True)
        self.results["stages"][stage] = result
        return result

    def _command(
        self, stage: str, config: str, command: str, recipe: str, flags: list[str]
    ) -> tuple[list[str], dict[str, str]]:
        """The user's ``accelerate launch`` command for a stage, starting ``gpu_training.py
        entry``, and its environment."""
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
            str(ENTRY_SCRIPT),
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
        return argv, env

    def _result(
        self, stage: str, config: str, command: str, code: Any, wall: float, gpu_peak_mib: Any
    ) -> dict[str, Any]:
        """A launched stage's figures, from rank 0's record."""
        rank0 = self.work / "ranks" / f"{stage}_rank0.json"
        record = json.loads(rank0.read_text()) if rank0.is_file() else {}
        steps = record.get("step_s", [])
        return {
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
            "gpu_used_peak_gib": _round(gpu_peak_mib / 1024 if gpu_peak_mib else None),
        }

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
