"""Learning benchmark v2: does SFT then TRLOO make SmolLM2-135M write correct Triton kernels
for tasks it has never seen?

One command runs the whole experiment on the 2-core CPU box and writes its numbers and plots:

    python benchmarks/learning.py [--out runs/bench/learning] [--kernelbench .kb/KernelBench]

1. **synth**: ``kernelrl synth`` (``recipes/smollm2/learning/synth.yaml``) draws synthetic
   KernelBench-format tasks, decontaminated against KernelBench levels 1-3 (``--kernelbench``),
   split by operator combination into train / validation / held-out (a held-out task combines
   operators seen in training in a combination never seen), and writes Triton reference
   solutions for training tasks, kept for SFT only when the environment judged them correct.
   Seeded samples of the validation and held-out splits (stratified by family) become the task
   folders of the sweeps below.
2. **sft** (``sft.yaml``): the verified references, with the same prompt as every other stage;
   checkpoints within the epoch. **select_sft** evaluates each checkpoint on the validation
   sample and keeps the best (correct@1, then compile rate): settings are chosen on
   validation, never on held-out.
3. **eval_sft** and **eval_base**: ``kernelrl eval`` of the chosen SFT model and of the base
   model on the held-out sample (``eval_heldout.yaml``: ``--samples`` per task, one turn).
4. **rl**: TRLOO (``trloo.yaml``) from the chosen SFT model on train tasks only, with
   checkpoints; **select_rl** picks the checkpoint with the best validation correct@1.
   ``--curriculum pass-rate`` first runs **curriculum**: the SFT model's pass rate on a seeded
   sample of train tasks (``--curriculum-tasks``, ``--samples`` each, the held-out sweep's
   settings), and RL trains only on the tasks it solves sometimes, neither never nor always
   (a group of equal rewards has no advantage); its stages carry ``_passrate``.
   ``--curriculum beyond-references`` trains on the train tasks longer than any reference
   solution (the synthesis's ``reference_max_pointwise``, which also keeps validation and
   held-out to such chains); its stages carry ``_beyond``.
5. **eval_rl**: the chosen RL checkpoint on the held-out sample. With the pass-rate
   curriculum, **train_check** then samples the SFT model and that checkpoint anew on RL's own
   train tasks (``train_check*.md``): whether RL learned even the tasks it trained on.
   ``--advantage grpo`` runs steps 4-5 again with the same recipe and budget but GRPO's
   advantage (stages ``rl_grpo``, ``select_rl_grpo``, ``eval_rl_grpo``), beside TRLOO's.
6. **report**: correct@1, pass@k, format-error, token-limit, compile and integrity-violation
   rates and the mean reward at each stage with paired bootstrap 95% intervals
   (``learning_report.py``), curves (SFT loss; RL reward, correct rate and lengths) in
   ``learning.png``, ``summary.json`` and ``table.md``, copied to ``--results``.

Every stage is skipped when its output is complete, so rerunning the command continues an
interrupted run, across sessions (``--force STAGE`` redoes one). ``--replay --force eval_``
judges the held-out stages' stored completions again, on the environment as it is now (their
first completions are kept under ``generated/``). RL continues from its latest
checkpoint, so ``--rl-steps 30 --force rl select_rl eval_rl`` after a shorter run trains on.
``--rl-set learning_rate=5e-5 --rl-tag lr5e5`` runs an RL variant beside the others (its stages
suffixed ``_lr5e5``, its row labelled with the overrides). Variants trained side by side are
compared on validation by **select_variant** (``--rl-variants gpu gpu_lr6e4``: the tags, the
recipe's own settings first): only the chosen one's held-out sweep is the RL result. Processes
running stages of one folder at once (one per GPU) share ``stages.json`` safely.
``--rl-from RUN --rl-tag gpu`` takes the RL stage from a run of ``benchmarks/learning_gpu_rl.sh``
on a GPU machine (``trloo_gpu.yaml``: far more rollouts per step than 2 cores afford) and
validates, selects and evaluates its checkpoints here like any other; LoRA checkpoints are
merged into the SFT model for evaluation.
Sweeps can run on a GPU machine instead (``--eval-set client=transformers env_device=cuda ...``
with ``--only`` the stages to run there, ``benchmarks/learning_gpu.sh``): faster, so held-out
samples can be larger; every stage compared in one table must then share those settings.
So can SFT: ``--synth-set reference_solutions=2400`` gives it a reference per train task,
``--sft-recipe recipes/smollm2/learning/sft_gpu.yaml`` trains on them there
(``learning_gpu.sh BENCH - sft``), and ``--sft-model`` records where the chosen checkpoint lies
on the machine that evaluates it.
Before each heavy stage the script waits for ``--min-free-gb`` of memory; stage wall times,
peak RSS and load averages are recorded.

On CPU the environment times kernels in Triton's interpreter, so speedups mean nothing there
and the reward's speedup term is not meaningful: the reward is correctness, format and
integrity (see the README's reward table).
"""

from __future__ import annotations

import argparse
import copy
import fcntl
import json
import math
import os
import queue
import random
import re
import resource
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning_report import (  # noqa: E402
    attempts,
    checkpoint_step,
    estimate,
    markdown,
    plot,
    rl_curve,
    sft_curve,
)

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes" / "smollm2" / "learning"
STAGES = (  # eval_base after SFT: the stages are independent, and SFT is what others wait for
    "synth",
    "sft",
    "select_sft",
    "eval_sft",
    "eval_base",
    "curriculum",
    "rl",
    "select_rl",
    "select_variant",
    "eval_rl",
    "train_check",
    "report",
)
EVALS = {
    "eval_base": "before SFT",
    "eval_sft": "after SFT",
    "eval_rl": "after TRLOO",
    "eval_rl_grpo": "after GRPO",
    "eval_rl_passrate": "after TRLOO, pass-rate curriculum",
}
#: The suffix of the RL stages trained on each curriculum's tasks.
CURRICULUM_SUFFIX = {"difficulty": "", "pass-rate": "_passrate", "beyond-references": "_beyond"}
# Named with a suffix for an advantage other than TRLOO, for a curriculum (CURRICULUM_SUFFIX) and
# for a --rl-tag (a variant with --rl-set overrides).
RL_STAGES = ("rl", "select_rl", "eval_rl", "train_check")
BASE_MODEL = "smollm2-135m-instruct"


# ---------------------------------------------------------------------------------- tasks
def kernelbench_sources(kernelbench: Path | None) -> list[str]:
    """Decontamination sources: KernelBench levels 1-3 when a checkout is given (the repository
    or its KernelBench/ folder)."""
    from kernelrl.eval.benchmarks import kernelbench_levels_folder

    if kernelbench is None:
        return []
    levels = [kernelbench_levels_folder(kernelbench) / f"level{n}" for n in (1, 2, 3)]
    missing = [str(p) for p in levels if not p.is_dir()]
    if missing:
        raise SystemExit(f"--kernelbench: no {', '.join(missing)}")
    return [f"kernelbench:{p}" for p in levels]


def sample_tasks(parquet: Path, count: int, seed: int) -> list[dict[str, Any]]:
    """A seeded sample of a split, as even across families as the split allows."""
    import datasets

    return sample_rows(list(datasets.Dataset.from_parquet(str(parquet))), count, seed)


def sample_rows(rows: list[dict[str, Any]], count: int, seed: int) -> list[dict[str, Any]]:
    by_family: dict[str, list[dict[str, Any]]] = {}
    for row in sorted(rows, key=lambda r: r["id"]):
        by_family.setdefault(row["family"], []).append(row)
    rng = random.Random(seed)
    for family_rows in by_family.values():
        rng.shuffle(family_rows)
    picked: list[dict[str, Any]] = []
    while len(picked) < count and any(by_family.values()):
        for family in sorted(by_family):
            if by_family[family] and len(picked) < count:
                picked.append(by_family[family].pop())
    return picked


def write_task_folder(rows: list[dict[str, Any]], folder: Path) -> None:
    """The tasks as KernelBench-style files (``<id>.py``), what ``benchmark: folder`` reads."""
    folder.mkdir(parents=True, exist_ok=True)
    for row in rows:
        (folder / f"{row['id']}.py").write_text(row["source"])


def write_sft_data(synth_dir: Path, folder: Path) -> int:
    """The verified references with the prompt every stage uses (no system message, no
    one-shot example): the model is trained on exactly what it is later asked."""
    import datasets

    from kernelrl.prompts import prompt_builders

    builder = prompt_builders(RECIPES / "prompt.txt", system=None, one_shot=False)["triton"]
    tasks = datasets.Dataset.from_parquet(str(synth_dir / "tasks" / "train" / "data.parquet"))
    sources = dict(zip(tasks["id"], tasks["source"], strict=True))
    sft = datasets.Dataset.from_parquet(str(synth_dir / "sft" / "data.parquet"))
    rows = [
        {
            "task_id": row["task_id"],
            "prompt": builder.first_messages(sources[row["task_id"]]),
            "completion": row["completion"],
        }
        for row in sft
    ]
    (folder / "sft").mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_list(rows).to_parquet(str(folder / "sft" / "train.parquet"))
    return len(rows)


# ---------------------------------------------------------------------------------- running
def meminfo_gb(field: str, missing: float = math.inf) -> float:
    """One field of /proc/meminfo (MemAvailable, MemTotal) in GB."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 2**20
    return missing


def available_gb() -> float:
    return meminfo_gb("MemAvailable")


def wait_for_memory(min_gb: float, log: Any) -> None:
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
) -> dict[str, Any]:
    """Run one kernelrl command, its output to ``logs/<name>.log``; wall time, peak RSS."""
    wait_for_memory(min_gb, log)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    log_path = out / "logs" / f"{name}.log"
    command = [sys.executable, "-m", "kernelrl.launch.cli", *argv]
    log(f"[{name}] {' '.join(command[2:])}")
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
    return sorted(folder.glob("checkpoint-*"), key=checkpoint_step)


_REQUIRED = object()


def _recipe_value(recipe: Path, key: str, default: Any = _REQUIRED) -> Any:
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


class Benchmark:
    """The stages, their records (``stages.json``) and the commands they run."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = (ROOT / args.out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.state_path = self.out / "stages.json"
        self.stages: dict[str, Any] = (
            json.loads(self.state_path.read_text()) if self.state_path.exists() else {}
        )
        self._saved = copy.deepcopy(self.stages)  # what this process last read or wrote
        self._records = threading.Lock()  # stages run from threads: one sweep per GPU
        self.synth_dir = self.out / "synth"
        self.suffix = self.rl_suffix(args.rl_tag)
        self.sft_dir = self.out / "sft_model"
        self.rl_dir = self.out / f"rl_model{self.suffix}"
        self.curriculum_parquet = self.out / "curriculum" / "data.parquet"
        self.folders = {s: self.out / "tasks" / s for s in ("validation", "heldout")}
        # The RL recipe's own reward, so held-out reward and training reward are one function.
        self.rl_recipe = (ROOT / args.rl_recipe).resolve()
        self.reward_config = recipe_reward(self.rl_recipe)

    def relocate_sft(self, model: str) -> None:
        """The chosen SFT checkpoint at its path on this machine (a GPU machine it was copied
        to); the path it was chosen at is kept beside it."""
        chosen = self.stages["select_sft"]
        if chosen["chosen"] != model:
            chosen.setdefault("chosen_on_cpu_box", chosen["chosen"])
            chosen["chosen"] = model
            self.save()

    def log(self, message: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {message}"
        print(line, flush=True)
        with open(self.out / "learning.log", "a") as handle:
            handle.write(line + "\n")

    def done(self, name: str) -> bool:
        return name in self.stages and not any(name.startswith(f) for f in self.args.force)

    def save(self) -> None:
        """Write the records this process changed, keeping those another process wrote since:
        on a machine of several GPUs one process per GPU runs its own stages in this folder."""
        with open(self.out / ".stages.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            on_disk = json.loads(self.state_path.read_text()) if self.state_path.exists() else {}
            for name, record in self.stages.items():
                if self._saved.get(name) != record:
                    on_disk[name] = record
            partial = self.state_path.with_suffix(".json.partial")
            partial.write_text(json.dumps(on_disk, indent=1))
            partial.replace(self.state_path)
        self.stages = on_disk
        self._saved = copy.deepcopy(on_disk)

    def run(self, name: str, argv: list[str], placement: Placement | None = None) -> None:
        """Run one kernelrl command as stage ``name`` unless it is recorded as done."""
        if self.done(name):
            return
        adopted = adopt_from_log(self.out / "logs" / f"{name}.log")
        if adopted is not None and not any(name.startswith(f) for f in self.args.force):
            self.log(f"[{name}] finished earlier ({adopted['wall_s'] / 60:.1f} min)")
            record = adopted
        else:
            record = run_stage(
                name, argv, self.out, self.log, self.args.min_free_gb, placement=placement
            )
        with self._records:
            self.stages[name] = {**record, "argv": argv}
            self.save()

    def placements(self) -> list[Placement | None]:
        """Where this invocation's stages run: one placement per ``--sweep-gpus`` GPU, or the
        process's own environment."""
        return [*placements(self.args.sweep_gpus)] if self.args.sweep_gpus else [None]

    # ------------------------------------------------------------------ stage commands
    def eval_argv(self, model: str, folder: Path, samples: int, output: Path) -> list[str]:
        argv = ["eval", "--config", str(RECIPES / "eval_heldout.yaml")]
        argv += ["--model_name_or_path", model, "--benchmark", "folder"]
        argv += ["--benchmark_path", str(folder), "--samples", str(samples)]
        argv += ["--pass_k", "1", *([str(samples)] if samples > 1 else [])]
        argv += ["--output_dir", str(output)]
        argv += override_flags(self.args.eval_set)
        if any(output.name.startswith(f) or f in output.parts for f in self.args.force):
            argv += ["--overwrite", "true"]
        return argv

    def synth(self) -> None:
        sources = kernelbench_sources(self.args.kernelbench)
        argv = ["synth", "--config", str(RECIPES / "synth.yaml"), "--seed", str(self.args.seed)]
        argv += ["--output_dir", str(self.synth_dir)]
        argv += override_flags(self.args.synth_set)
        if sources:
            argv += ["--benchmark_sources", *sources]
        self.run("synth", argv)
        if "heldout_tasks" in self.stages["synth"] and not self.args.force:
            return
        sizes = {"validation": self.args.validation_tasks, "heldout": self.args.heldout_tasks}
        for split, folder in self.folders.items():
            parquet = self.synth_dir / "tasks" / split / "data.parquet"
            rows = sample_tasks(parquet, sizes[split], self.args.seed)
            shutil.rmtree(folder, ignore_errors=True)
            write_task_folder(rows, folder)
            self.stages["synth"][f"{split}_tasks"] = sorted(r["id"] for r in rows)
        self.stages["synth"]["sft_rows"] = write_sft_data(self.synth_dir, self.out / "sft_data")
        self.stages["synth"]["decontaminated_against"] = sources or "the test fixture only"
        self.stages["synth"]["summary"] = json.loads((self.synth_dir / "summary.json").read_text())
        self.save()

    def sft(self) -> None:
        recipe = (ROOT / self.args.sft_recipe).resolve()
        rows = self.stages["synth"]["sft_rows"]
        batch = _recipe_value(recipe, "per_device_train_batch_size") * _recipe_value(
            recipe, "gradient_accumulation_steps"
        )
        steps = math.ceil(math.ceil(rows / batch) * self.args.sft_epochs)
        argv = ["sft", "--config", str(recipe), "--dataset_path", str(self.out / "sft_data")]
        argv += ["--num_train_epochs", str(self.args.sft_epochs), "--output_dir", str(self.sft_dir)]
        argv += ["--save_strategy", "steps", "--save_steps", str(math.ceil(steps / 2))]
        if checkpoints(self.sft_dir):  # an interrupted run goes on from its last checkpoint
            argv += ["--resume_from_checkpoint", "true"]
        self.run("sft", argv, self.placements()[0])

    def select(self, stage: str, candidates: list[Path]) -> str:
        """The candidate with the best validation correct@1 (then compile rate; then the later
        one): the only place a setting is chosen, and it never sees the held-out tasks."""
        if self.done(stage):
            return self.stages[stage]["chosen"]
        if not candidates:
            raise SystemExit(f"{stage}: no checkpoint to choose from")
        outputs = {
            path: self.out / "validation" / f"val_{stage.removeprefix('select_')}_{path.name}"
            for path in candidates
        }
        models = {path: self.model_folder(str(path)) for path in candidates}
        free: queue.Queue[Placement | None] = queue.Queue()
        for placement in self.placements():
            free.put(placement)

        def validate(path: Path) -> None:  # one sweep per GPU at a time
            placement = free.get()
            try:
                argv = self.eval_argv(models[path], self.folders["validation"], 2, outputs[path])
                self.run(outputs[path].name, argv, placement)
            finally:
                free.put(placement)

        with ThreadPoolExecutor(free.qsize()) as pool:
            list(pool.map(validate, candidates))
        scores = {}
        for index, path in enumerate(candidates):
            by_task = attempts(outputs[path] / "samples.jsonl", self.reward_config)
            flat = [a for rows in by_task.values() for a in rows]
            mean = {m: sum(a[m] for a in flat) / max(len(flat), 1) for m in ("correct", "compile")}
            scores[str(path)] = {**mean, "attempts": len(flat), "order": index}
        chosen = max(
            scores,
            key=lambda p: (scores[p]["correct"], scores[p]["compile"], scores[p]["order"]),
        )
        self.stages[stage] = {"validation": scores, "chosen": chosen}
        self.save()
        self.log(f"[{stage}] chose {chosen}: validation {scores[chosen]}")
        return chosen

    def rl_suffix(self, tag: str) -> str:
        """The suffix of an RL run's stages: its advantage, curriculum and variant tag."""
        suffix = "" if self.args.advantage == "trloo" else f"_{self.args.advantage}"
        suffix += CURRICULUM_SUFFIX[self.args.curriculum]
        return suffix + (f"_{tag}" if tag else "")

    def stage_name(self, name: str) -> str:
        """RL stages carry the advantage's suffix, so TRLOO's and GRPO's results sit side by side."""
        return f"{name}{self.suffix}" if name in RL_STAGES else name

    def select_variant(self) -> str | None:
        """Of RL variants trained side by side (``--rl-variants``: their ``--rl-tag``s, the
        recipe's own settings first), the one whose chosen checkpoint scored best on
        validation (then compile rate; then the earlier listed). Settings are chosen here, on
        validation, so that only the chosen variant's held-out sweep is the RL result. A variant
        whose RL or validation failed is recorded as not validated, not chosen."""
        tags = self.args.rl_variants
        if not tags:
            return None
        if self.done("select_variant"):
            return self.stages["select_variant"]["chosen"]
        scores, missing = {}, []
        for order, tag in enumerate(tags):
            record = self.stages.get(f"select_rl{self.rl_suffix(tag)}")
            if record is None:  # its RL or its validation failed: it cannot be chosen
                missing.append(tag)
                continue
            scores[tag] = {**record["validation"][record["chosen"]], "checkpoint": record["chosen"]}
            scores[tag]["order"] = -order
        if not scores:
            raise SystemExit(f"select_variant: no variant of {tags} was validated (select_rl)")
        chosen = max(
            scores,
            key=lambda t: (scores[t]["correct"], scores[t]["compile"], scores[t]["order"]),
        )
        self.stages["select_variant"] = {"validation": scores, "chosen": chosen}
        if missing:
            self.stages["select_variant"]["not_validated"] = missing
        self.save()
        self.log(f"[select_variant] chose {chosen!r}: validation {scores[chosen]}")
        return chosen

    def curriculum(self, sft_model: str) -> Path:
        """The train tasks RL draws from: the whole train split (the recipe's difficulty tag
        filters it); with ``--curriculum pass-rate`` those of a sample that the SFT model
        solved in some but not all of its samples; with ``beyond-references`` those longer
        than any reference solution. Chosen from train tasks only."""
        train = self.synth_dir / "tasks" / "train" / "data.parquet"
        if self.args.curriculum == "difficulty":
            return train
        parquet = self.curriculum_parquet
        if self.done("curriculum") and parquet.exists():
            return parquet
        if self.args.curriculum == "beyond-references":
            return self.beyond_references(train)
        import datasets

        difficulty = _recipe_value(self.rl_recipe, "task_difficulty", default="")
        pool = [
            row
            for row in datasets.Dataset.from_parquet(str(train))
            if not difficulty or row["difficulty"] == difficulty
        ]
        rows = sample_rows(pool, self.args.curriculum_tasks, self.args.seed)
        folder = self.out / "tasks" / "curriculum"
        shutil.rmtree(folder, ignore_errors=True)
        write_task_folder(rows, folder)
        output = self.out / "curriculum_eval"
        self.run("curriculum_eval", self.eval_argv(sft_model, folder, self.args.samples, output))
        by_task = attempts(output / "samples.jsonl", self.reward_config)
        rates = {
            task: sum(a["correct"] for a in runs) / len(runs) for task, runs in by_task.items()
        }
        kept = sorted(task for task, rate in rates.items() if 0 < rate < 1)
        if not kept:
            raise SystemExit(
                "curriculum: the SFT model solves none of the sampled train tasks "
                "sometimes; sample more (--curriculum-tasks)"
            )
        kept_ids = set(kept)
        chosen = datasets.Dataset.from_list([row for row in rows if row["id"] in kept_ids])
        parquet.parent.mkdir(parents=True, exist_ok=True)
        chosen.to_parquet(str(parquet))
        self.stages["curriculum"] = {"pass_rates": rates, "kept": kept, "difficulty": difficulty}
        self.save()
        self.log(f"[curriculum] {len(kept)} of {len(rates)} train tasks solved sometimes")
        return parquet

    def beyond_references(self, train: Path) -> Path:
        """The train tasks longer than any reference solution (synthesis's
        ``reference_max_pointwise``): chains SFT saw no example of, the ones the evaluation
        splits hold, where RL has something to add to what SFT copied."""
        import datasets

        from kernelrl.data.synth.graph import pointwise_in

        recipe = json.loads((self.synth_dir / "recipe.json").read_text())
        tier = recipe.get("reference_max_pointwise", 0)
        if not tier:
            raise SystemExit(
                "curriculum beyond-references: the synthesis has no reference tier "
                "(--synth-set reference_max_pointwise=N)"
            )
        rows = [
            row
            for row in datasets.Dataset.from_parquet(str(train))
            if pointwise_in(row["combination"]) > tier
        ]
        if not rows:
            raise SystemExit(f"curriculum: no train task has more than {tier} pointwise operators")
        parquet = self.curriculum_parquet
        parquet.parent.mkdir(parents=True, exist_ok=True)
        datasets.Dataset.from_list(rows).to_parquet(str(parquet))
        self.stages["curriculum"] = {
            "kept": sorted(row["id"] for row in rows),
            "rule": f"more than {tier} pointwise operators",
        }
        self.save()
        self.log(f"[curriculum] {len(rows)} train tasks longer than the references")
        return parquet

    def rl(self, sft_model: str) -> None:
        if self.args.rl_from:
            self.adopt_rl(self.args.rl_from)
            return
        train = self.curriculum(sft_model)
        argv = ["train", "--config", str(self.rl_recipe)]
        argv += [
            "--advantage",
            self.args.advantage,
            "--run_name",
            f"learning-{self.args.advantage}",
        ]
        argv += ["--model_name_or_path", sft_model, "--tasks", f"parquet:{train}"]
        argv += [
            "--max_steps",
            str(self.args.rl_steps),
            "--save_steps",
            str(self.args.rl_save_every),
        ]
        argv += ["--output_dir", str(self.rl_dir)]
        # completions repeated in a group, a step or a resumed run are evaluated once
        argv += ["--env_store_path", str(self.rl_dir / "env_results.sqlite")]
        argv += override_flags(self.args.rl_set)
        if checkpoints(self.rl_dir):  # continue, as an uninterrupted run would have
            argv += ["--resume_from_checkpoint", "true"]
        self.run(self.stage_name("rl"), argv)

    def adopt_rl(self, folder: Path) -> None:
        """RL that ran elsewhere (``benchmarks/learning_gpu_rl.sh`` on a GPU machine): its
        scheduled checkpoints (every ``save_steps``) and its last become this run's candidates;
        the checkpoints a time-limited call saved on stopping are resume points, not
        candidates. Validation, selection and held-out evaluation then run here as for any RL
        run, on the same tasks, prompt and sampling."""
        stage = self.stage_name("rl")
        if self.done(stage):
            return
        found = checkpoints(folder)
        if not found:
            raise SystemExit(f"--rl-from: no checkpoint-* in {folder}")
        every = json.loads((found[-1] / "trainer_state.json").read_text())["save_steps"]
        chosen = [p for p in found if checkpoint_step(p) % every == 0]
        chosen += [found[-1]] if found[-1] not in chosen else []
        self.rl_dir.mkdir(parents=True, exist_ok=True)
        for path in chosen:
            shutil.copytree(path, self.rl_dir / path.name, dirs_exist_ok=True)
        runs = json.loads((folder / "runs.json").read_text())
        self.stages[stage] = {
            "adopted_from": str(folder),
            "runs": runs,
            "wall_s": round(sum(r["wall_s"] for r in runs), 1),
            "returncode": max(r["exit_status"] for r in runs),
            "log": str(folder / "train.log"),
            "candidates": [p.name for p in chosen],
        }
        self.save()
        self.log(f"[{stage}] adopted {[p.name for p in chosen]} from {folder}")

    def model_folder(self, checkpoint: str) -> str:
        """A checkpoint as ``kernelrl eval`` loads it: LoRA adapters (a ``use_peft`` run)
        merged into the SFT model they were trained on, once, in ``merged/`` beside them."""
        path = Path(checkpoint)
        if not (path / "adapter_config.json").exists():
            return checkpoint
        merged = path / "merged"
        if not (merged / "config.json").exists():
            import torch
            from peft import PeftModel
            from transformers import AutoModelForCausalLM, AutoTokenizer

            base_path = self.stages["select_sft"]["chosen"]
            base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
            model = PeftModel.from_pretrained(base, str(path)).merge_and_unload()
            model.save_pretrained(str(merged))
            AutoTokenizer.from_pretrained(base_path).save_pretrained(str(merged))
        return str(merged)

    def evaluate(self, stage: str, model: str) -> None:
        folder = self.folders["heldout"]
        argv = self.eval_argv(self.model_folder(model), folder, self.args.samples, self.out / stage)
        if self.args.replay:  # the same completions, judged by today's environment
            generated = self.out / "generated" / f"{stage}.jsonl"
            if not generated.exists():
                generated.parent.mkdir(exist_ok=True)
                shutil.copyfile(self.out / stage / "samples.jsonl", generated)
            argv += ["--client", "fixed", "--fixed_solutions", str(generated)]
        self.run(stage, argv)
        if stage.startswith("eval_rl") and stage not in EVALS:
            self.stages[stage]["label"] = self.rl_label()
            self.save()

    def train_check(self, rl_model: str) -> None:
        """Did RL learn the tasks it trained on? The SFT model and the chosen RL checkpoint,
        sampled anew on RL's train tasks (the pass-rate curriculum's; the SFT rates that chose
        them are biased by that choice): tells an update too weak to move even these from one
        that moves them without reaching held-out tasks."""
        if self.args.curriculum != "pass-rate":
            return
        import datasets

        folder = self.out / "tasks" / "rl_train"
        if not folder.is_dir():
            rows = list(datasets.Dataset.from_parquet(str(self.curriculum_parquet)))
            write_task_folder(rows, folder)
        models = {"train_sft": self.stages["select_sft"]["chosen"]}
        models[self.stage_name("train_check")] = self.model_folder(rl_model)
        for stage, model in models.items():
            output = self.out / "train_check" / stage
            self.run(stage, self.eval_argv(model, folder, self.args.samples, output))

    def train_check_table(self) -> str:
        """The train check's rates and paired difference, as the held-out table gives them."""
        stage = self.stage_name("train_check")
        folder = self.out / "train_check"
        if not all((folder / s / "samples.jsonl").exists() for s in ("train_sft", stage)):
            return ""
        runs = {
            s: attempts(folder / s / "samples.jsonl", self.reward_config)
            for s in ("train_sft", stage)
        }
        tasks = self.stages["curriculum"]["kept"]
        table = estimate(runs, tasks, self.args.samples, self.args.resamples, self.args.seed)
        labels = {"train_sft": "after SFT", stage: self.rl_label()}
        return markdown(table, labels, {}, scope="RL's own train tasks")

    # ------------------------------------------------------------------ report
    def rl_label(self) -> str:
        """How this invocation's RL run is named in the report's rows and curves: after its
        advantage, the variant's own (``--rl-set advantage=grpo``) where it overrides the flag's."""
        settings = list(self.args.rl_set or [])
        advantage = self.args.advantage
        for setting in [s for s in settings if s.startswith("advantage=")]:
            advantage = setting.partition("=")[2]
            settings.remove(setting)
        label = f"after {advantage.upper()}"
        if self.args.curriculum != "difficulty":
            label += f", {self.args.curriculum} curriculum"
        if self.args.rl_from:
            runs = self.stages[self.stage_name("rl")]["runs"]
            ranks = runs[0].get("ranks", 1)
            device = f"{ranks} x {runs[0]['device']}" if ranks > 1 else runs[0]["device"]
            label += f", {device}, {Path(runs[0]['recipe']).name}"
        if settings:
            label += ", " + " ".join(settings)
        chosen = self.stages.get(self.stage_name("select_rl"), {}).get("chosen")
        if chosen:  # two runs of one recipe on one device differ by the checkpoint chosen
            label += f", {Path(chosen).name}"
        if self.stages.get("select_variant", {}).get("chosen") == self.args.rl_tag:
            label += ", variant chosen on validation"
        return label

    def report_evals(self) -> dict[str, str]:
        """The held-out stages and their row labels: the fixed ones, then every tagged RL run
        recorded in ``stages.json`` (each keeps the label it was run with)."""
        evals = dict(EVALS)
        for stage, record in self.stages.items():
            if stage.startswith("eval_rl") and stage not in evals:
                evals[stage] = record.get("label", stage)
        return evals

    def report(self) -> None:
        evals = self.report_evals()
        runs = {
            stage: attempts(self.out / stage / "samples.jsonl", self.reward_config)
            for stage in evals
            if (self.out / stage / "samples.jsonl").exists()
        }
        heldout = self.stages["synth"]["heldout_tasks"]
        table = estimate(runs, heldout, self.args.samples, self.args.resamples, self.args.seed)
        table["machine"] = {
            "cpu_count": os.cpu_count(),
            "memory_gb": round(meminfo_gb("MemTotal", math.nan), 1),
        }
        table["stage_runs"] = self.stages
        table["settings"] = {k: str(v) for k, v in vars(self.args).items()}
        results = (ROOT / self.args.results).resolve()
        results.mkdir(parents=True, exist_ok=True)
        text = markdown(table, evals, self.stages)
        train_text = self.train_check_table()
        for folder in (self.out, results):
            (folder / "summary.json").write_text(json.dumps(table, indent=1))
            (folder / "table.md").write_text(text)
            if train_text:
                (folder / f"train_check{self.suffix}.md").write_text(train_text)
            plot(
                table,
                evals,
                sft_curve(self.sft_dir / "sft_summary.json"),
                {
                    label.removeprefix("after "): rl_curve(
                        self.out / f"rl_model{stage.removeprefix('eval_rl')}"
                    )
                    for stage, label in evals.items()
                    if stage.startswith("eval_rl")
                },
                folder / "learning.png",
                "SmolLM2-135M-Instruct on held-out synthetic tasks: before SFT, after SFT, "
                "after RL",
            )
        self.log("\n" + text + ("\n" + train_text if train_text else ""))
        self.log(f"report in {results}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/bench/learning", help="working folder")
    parser.add_argument("--results", default="benchmarks/results/learning_cpu_v2")
    parser.add_argument(
        "--kernelbench",
        type=Path,
        default=ROOT / ".kb" / "KernelBench" if (ROOT / ".kb" / "KernelBench").is_dir() else None,
        help="a KernelBench checkout (or its KernelBench/ folder), to decontaminate against "
        "(levels 1-3)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--heldout-tasks", type=int, default=40)
    parser.add_argument("--validation-tasks", type=int, default=24)
    parser.add_argument("--samples", type=int, default=4, help="held-out samples per task (k)")
    parser.add_argument("--sft-epochs", type=float, default=1.0)
    parser.add_argument(
        "--sft-recipe",
        default=str(RECIPES.relative_to(ROOT) / "sft.yaml"),
        help="SFT's recipe (sft_gpu.yaml on a GPU machine: larger batches, bf16)",
    )
    parser.add_argument("--rl-steps", type=int, default=16)
    parser.add_argument("--rl-save-every", type=int, default=8)
    parser.add_argument(
        "--advantage",
        choices=("trloo", "grpo"),
        default="trloo",
        help="the RL stages' estimator; grpo runs them as rl_grpo, select_rl_grpo, eval_rl_grpo",
    )
    parser.add_argument(
        "--curriculum",
        choices=tuple(CURRICULUM_SUFFIX),
        default="difficulty",
        help="RL's train tasks: the recipe's difficulty tag; those of a sample that the SFT "
        "model solves sometimes (stages suffixed _passrate); or those longer than the "
        "synthesis's reference tier (stages suffixed _beyond)",
    )
    parser.add_argument(
        "--curriculum-tasks", type=int, default=40, help="train tasks sampled for pass rates"
    )
    parser.add_argument(
        "--synth-set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="synthesis settings to override (e.g. reference_solutions=2400: SFT data for a "
        "GPU machine's SFT)",
    )
    parser.add_argument(
        "--rl-set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="RL recipe settings to override (e.g. learning_rate=5e-5); give them a --rl-tag",
    )
    parser.add_argument("--rl-tag", default="", help="suffix of this RL variant's stages")
    parser.add_argument(
        "--rl-variants",
        nargs="*",
        default=[],
        metavar="TAG",
        help="select_variant: the --rl-tag of each RL variant whose select_rl ran, the recipe's "
        "own settings first; the one best on validation is the RL result",
    )
    parser.add_argument(
        "--rl-recipe",
        default=str(RECIPES.relative_to(ROOT) / "trloo.yaml"),
        help="RL's recipe: its reward scores every stage, its task_difficulty filters the "
        "curriculum (trloo_gpu.yaml for a GPU machine's run)",
    )
    parser.add_argument(
        "--rl-from",
        type=Path,
        default=None,
        help="a run folder of benchmarks/learning_gpu_rl.sh: RL ran there (a GPU machine); its "
        "checkpoints are validated, selected and evaluated here (give it a --rl-tag)",
    )
    parser.add_argument(
        "--sft-model",
        default="",
        help="the SFT checkpoint select_sft chose, at its path on this machine (a GPU machine "
        "it was copied to)",
    )
    parser.add_argument(
        "--eval-set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="settings of every sweep (validation, held-out, curriculum) to override, e.g. "
        "client=transformers env_device=cuda on a GPU machine; stages compared with each other "
        "must share them",
    )
    parser.add_argument(
        "--only",
        nargs="*",
        choices=STAGES,
        default=None,
        help="run these stages and no other (a stage whose input another machine made: the "
        "curriculum or the evaluations on a GPU machine, the report here)",
    )
    parser.add_argument(
        "--sweep-gpus",
        nargs="*",
        default=[],
        metavar="GPU",
        help="GPUs to run on (indices as CUDA_VISIBLE_DEVICES names them): a choice's "
        "validation sweeps spread over them, one per GPU, and SFT on the first",
    )
    parser.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples")
    parser.add_argument("--min-free-gb", type=float, default=6.0)
    parser.add_argument(
        "--force", nargs="*", default=[], help="redo the stages whose names start with these"
    )
    parser.add_argument("--stop-after", choices=STAGES, default="report")
    parser.add_argument(
        "--replay",
        action="store_true",
        help="held-out stages re-judge their stored completions (kernelrl eval --client fixed) "
        "instead of generating: the same answers on the current environment",
    )
    return parser


def stages_to_run(args: argparse.Namespace) -> list[str]:
    """The stages this invocation runs: up to ``--stop-after``, only those of ``--only``."""
    last = STAGES.index(args.stop_after)
    return [s for s in STAGES[: last + 1] if args.only is None or s in args.only]


def main() -> int:
    args = build_parser().parse_args()

    bench = Benchmark(args)
    if args.sft_model:
        bench.relocate_sft(args.sft_model)
    bench.log(f"learning benchmark v2 in {bench.out} ({os.cpu_count()} CPUs)")
    select_rl, eval_rl = bench.stage_name("select_rl"), bench.stage_name("eval_rl")
    steps = [
        ("synth", bench.synth),
        ("sft", bench.sft),
        ("select_sft", lambda: bench.select("select_sft", checkpoints(bench.sft_dir))),
        ("eval_sft", lambda: bench.evaluate("eval_sft", bench.stages["select_sft"]["chosen"])),
        ("eval_base", lambda: bench.evaluate("eval_base", BASE_MODEL)),
        ("curriculum", lambda: bench.curriculum(bench.stages["select_sft"]["chosen"])),
        ("rl", lambda: bench.rl(bench.stages["select_sft"]["chosen"])),
        ("select_rl", lambda: bench.select(select_rl, checkpoints(bench.rl_dir))),
        ("select_variant", bench.select_variant),
        ("eval_rl", lambda: bench.evaluate(eval_rl, bench.stages[select_rl]["chosen"])),
        ("train_check", lambda: bench.train_check(bench.stages[select_rl]["chosen"])),
        ("report", bench.report),
    ]
    selected = stages_to_run(args)
    for name, step in steps:
        if name in selected:
            step()
    return 0


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    sys.exit(main())
