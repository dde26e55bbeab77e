"""The learning benchmark's stage runner: one ``kernelrl`` command per stage, as a child process.

Kept apart from the stages themselves (``learning_bench``) so that what a stage runs and how it
is run (logs, wall time, peak memory, GPU placement, memory waits, adopting a stage that finished
elsewhere) can be read and tested on their own.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from learning_report import checkpoint_step

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes" / "smollm2" / "learning"
BASE_MODEL = "smollm2-135m-instruct"


def meminfo_gb(field: str, missing: float = math.inf) -> float:
    """One field of /proc/meminfo (MemAvailable, MemTotal) in GB."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 2**20
    return missing


def available_gb() -> float:
    """Memory a new stage could take now (MemAvailable), in GB."""
    return meminfo_gb("MemAvailable")


def wait_for_memory(min_gb: float, log: Any) -> None:
    """Hold a heavy stage until ``min_gb`` is free: on a shared box another process's peak
    would otherwise kill it midway."""
    waited = 0.0
    while available_gb() < min_gb:
        if waited == 0:
            log(f"waiting for {min_gb:.0f} GB of free memory (now {available_gb():.1f} GB)")
        time.sleep(15)
        waited += 15
    if waited:
        log(f"  waited {waited:.0f} s")


@dataclass(frozen=True)
class Placement:
    """Where a stage's command runs on a machine of several GPUs: one GPU and its share of the
    host's cores (a process given every GPU would drive them as one, ``nn.DataParallel``)."""

    gpu: str
    cores: frozenset[int]


def placements(gpus: list[str]) -> list[Placement]:
    """One placement per GPU, this process's cores split evenly between them."""
    cores = sorted(os.sched_getaffinity(0))
    share = max(len(cores) // len(gpus), 1)
    return [
        Placement(gpu, frozenset(cores[i * share : (i + 1) * share] or cores))
        for i, gpu in enumerate(gpus)
    ]


def run_stage(
    name: str,
    argv: list[str],
    out: Path,
    log: Any,
    min_gb: float,
    placement: Placement | None = None,
    script: Path | None = None,
) -> dict[str, Any]:
    """Run one kernelrl command (or ``script`` with ``argv``: a benchmark's own step), its
    output to ``logs/<name>.log``; wall time, peak RSS."""
    wait_for_memory(min_gb, log)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    log_path = out / "logs" / f"{name}.log"
    program = [str(script)] if script else ["-m", "kernelrl.launch.cli"]
    command = [sys.executable, *program, *argv]
    log(f"[{name}] {' '.join(command[1:])}")
    load_before = os.getloadavg()[0]
    started = time.time()
    time_bin = shutil.which("time") or "/usr/bin/time"
    wrapped = [time_bin, "-v", *command] if Path(time_bin).exists() else command
    env, pin = None, None
    if placement is not None:
        cores = placement.cores

        def pin() -> None:  # in the child, before it execs: its GPU's share of the cores
            os.sched_setaffinity(0, cores)

        env = {**os.environ, "CUDA_VISIBLE_DEVICES": placement.gpu}
    with open(log_path, "w") as handle:
        process = subprocess.run(
            wrapped, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT, env=env, preexec_fn=pin
        )
    wall = time.time() - started
    text = log_path.read_text(errors="replace")
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    info = {
        "wall_s": round(wall, 1),
        "returncode": process.returncode,
        "peak_rss_gb": round(int(peak.group(1)) / 2**20, 2) if peak else None,
        "load_avg_start": round(load_before, 2),
        "load_avg_end": round(os.getloadavg()[0], 2),
        "log": str(log_path),
    }
    if placement is not None:
        info["gpu"] = placement.gpu
    log(
        f"[{name}] exit {process.returncode} after {wall / 60:.1f} min, peak RSS {info['peak_rss_gb']} GB"
    )
    if process.returncode != 0:
        raise SystemExit(f"stage {name} failed (exit {process.returncode}); see {log_path}")
    return info


def adopt_from_log(log_path: Path) -> dict[str, Any] | None:
    """The record of a stage that ran to completion outside this process (its ``time -v``
    footer in the log says exit 0): wall time and peak RSS as measured there."""
    if not log_path.exists():
        return None
    text = log_path.read_text(errors="replace")
    status = re.search(r"Exit status: (\d+)", text)
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text)
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    killed = "Command terminated by signal" in text  # time -v then still says "Exit status: 0"
    if killed or not (status and wall and status.group(1) == "0"):
        return None
    seconds = 0.0
    for part in wall.group(1).split(":"):
        seconds = seconds * 60 + float(part)
    return {
        "wall_s": round(seconds, 1),
        "returncode": 0,
        "peak_rss_gb": round(int(peak.group(1)) / 2**20, 2) if peak else None,
        "log": str(log_path),
        "adopted": True,
    }


def checkpoints(folder: Path) -> list[Path]:
    """A run's ``checkpoint-N`` folders in step order (not name order: 10 after 5)."""
    return sorted(folder.glob("checkpoint-*"), key=checkpoint_step)


_REQUIRED = object()


def recipe_value(recipe: Path, key: str, default: Any = _REQUIRED) -> Any:
    """One key of a YAML recipe; ``default`` where the recipe lacks it (KeyError without one)."""
    import yaml

    values = yaml.safe_load(recipe.read_text())
    if key not in values and default is not _REQUIRED:
        return default
    return values[key]


def override_flags(settings: list[str]) -> list[str]:
    """``KEY=VALUE`` settings (``--rl-set``, ``--eval-set``) as the command-line flags that
    override a recipe's keys."""
    flags: list[str] = []
    for setting in settings:
        key, _, value = setting.partition("=")
        flags += [f"--{key}", value]
    return flags


def recipe_reward(recipe: Path) -> Any:
    """The reward a training recipe defines, parsed as training parses it, without the rest
    (a GPU recipe's bf16 would be refused on a CPU box, and it does not touch the reward)."""
    import yaml
    from trl import TrlParser

    from kernelrl.rewards import RewardConfig

    values = yaml.safe_load(recipe.read_text())
    (reward,) = TrlParser((RewardConfig,)).parse_dict(values, allow_extra_keys=True)
    return reward
