"""The learning benchmark's stages: their records (``stages.json``) and the commands they run.

``Benchmark`` holds the stages every run has (synthesis and its sweep folders, SFT, the choices
on validation, RL or its adoption from a GPU machine, the held-out sweeps); the curriculum and
train check (``learning_curriculum``), the KernelBench set (``learning_kb``) and the report
(``learning_output``) are mixed in from their own modules.
"""

from __future__ import annotations

import argparse
import copy
import fcntl
import json
import math
import queue
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from learning_answers import attempts
from learning_curriculum import CURRICULUM_SUFFIX, CurriculumStages
from learning_fresh import DATA, FRESH_COPY, MANIFEST, read_fresh
from learning_kb import KernelBenchStages
from learning_output import EVALS, ReportStages
from learning_report import checkpoint_step
from learning_run import (
    RECIPES,
    ROOT,
    Placement,
    adopt_from_log,
    checkpoints,
    override_flags,
    placements,
    recipe_reward,
    recipe_value,
    run_stage,
)
from learning_tasks import (
    kernelbench_sources,
    read_kernelbench_set,
    sample_tasks,
    write_kernelbench_set,
    write_sft_data,
    write_task_folder,
)

# Named with a suffix for an advantage other than TRLOO, for a curriculum (CURRICULUM_SUFFIX) and
# for a --rl-tag (a variant with --rl-set overrides).
RL_STAGES = ("rl", "select_rl", "eval_rl", "train_check")
#: What a run's seed R becomes for each use (``--run-seed``; docs/learning-protocol.md):
#: SFT's data order, RL's sampling and task draws, the sweeps' sampling.
SEED_OFFSETS = {"sft": 0, "rl": 100, "sweep": 200}


class Benchmark(CurriculumStages, KernelBenchStages, ReportStages):
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
        self.folders = {s: self.out / "tasks" / s for s in ("validation", "heldout", "kernelbench")}
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

    def run(
        self,
        name: str,
        argv: list[str],
        placement: Placement | None = None,
        script: Path | None = None,
    ) -> None:
        """Run one kernelrl command (or ``script``) as stage ``name`` unless it is recorded as
        done."""
        if self.done(name):
            return
        adopted = adopt_from_log(self.out / "logs" / f"{name}.log")
        if adopted is not None and not any(name.startswith(f) for f in self.args.force):
            self.log(f"[{name}] finished earlier ({adopted['wall_s'] / 60:.1f} min)")
            record = adopted
        else:
            record = run_stage(
                name, argv, self.out, self.log, self.args.min_free_gb, placement, script
            )
        with self._records:
            self.stages[name] = {**record, "argv": argv}
            self.save()

    def placements(self) -> list[Placement | None]:
        """Where this invocation's stages run: one placement per ``--sweep-gpus`` GPU, or the
        process's own environment."""
        return [*placements(self.args.sweep_gpus)] if self.args.sweep_gpus else [None]

    def seed_flags(self, stage: str) -> list[str]:
        """``--seed`` of SFT, RL or the sweeps when this run has a seed of its own
        (``--run-seed R``: the protocol's independent runs): R, R + 100 and R + 200,
        so that no two of them share a stream; the recipes' own otherwise."""
        if self.args.run_seed is None:
            return []
        return ["--seed", str(self.args.run_seed + SEED_OFFSETS[stage])]

    # ------------------------------------------------------------------ stage commands
    def eval_argv(self, model: str, folder: Path, samples: int, output: Path) -> list[str]:
        """One sweep's command: every stage's sweep shares the recipe and the overrides, so
        that the stages compared in one table are sampled and judged alike."""
        argv = ["eval", "--config", str(RECIPES / "eval_heldout.yaml")]
        argv += ["--model_name_or_path", model, "--benchmark", "folder"]
        argv += ["--benchmark_path", str(folder), "--samples", str(samples)]
        argv += ["--pass_k", "1", *([str(samples)] if samples > 1 else [])]
        argv += ["--output_dir", str(output), *self.seed_flags("sweep")]
        argv += override_flags(self.args.eval_set)
        if any(output.name.startswith(f) or f in output.parts for f in self.args.force):
            argv += ["--overwrite", "true"]
        return argv

    def synth(self) -> None:
        """The synthesis (once), its sweep folders and SFT rows; a fresh held-out split and the
        KernelBench set added to a finished synthesis when asked for."""
        sources: list[str] | None = None
        if not self.done("synth"):
            sources = kernelbench_sources(self.args.kernelbench)
            argv = ["synth", "--config", str(RECIPES / "synth.yaml")]
            argv += ["--seed", str(self.args.seed), "--output_dir", str(self.synth_dir)]
            argv += override_flags(self.args.synth_set)
            if sources:
                argv += ["--benchmark_sources", *sources]
            self.run("synth", argv)
        record = self.stages["synth"]
        if "heldout_tasks" not in record or self.args.force:
            sizes = {"validation": self.args.validation_tasks, "heldout": self.args.heldout_tasks}
            for split in ("validation", "heldout"):
                parquet = self.synth_dir / "tasks" / split / "data.parquet"
                rows = sample_tasks(parquet, sizes[split], self.args.seed)
                shutil.rmtree(self.folders[split], ignore_errors=True)
                write_task_folder(rows, self.folders[split])
                record[f"{split}_tasks"] = sorted(r["id"] for r in rows)
            record["sft_rows"] = write_sft_data(self.synth_dir, self.out / "sft_data")
            if sources is None:
                sources = kernelbench_sources(self.args.kernelbench)
            record["decontaminated_against"] = sources or "the test fixture only"
            record["summary"] = json.loads((self.synth_dir / "summary.json").read_text())
        if self.args.heldout_from and record.get("heldout_from") != str(self.args.heldout_from):
            self.use_fresh_heldout(self.args.heldout_from)
        if self.args.kernelbench_set and "kernelbench_tasks" not in record:
            if self.args.kernelbench is None:
                raise SystemExit("--kernelbench-set needs a KernelBench checkout (--kernelbench)")
            entries = read_kernelbench_set(self.args.kernelbench_set)
            folder = self.folders["kernelbench"]
            shutil.rmtree(folder, ignore_errors=True)
            record["kernelbench_tasks"] = write_kernelbench_set(
                entries, self.args.kernelbench, folder
            )
            record["kernelbench_families"] = entries
        self.save()

    def use_fresh_heldout(self, fresh: Path) -> None:
        """The held-out sweeps' tasks taken from a fresh split (``learning_fresh.py``) instead
        of the synthesis's held-out split: every task of it, each checked against the digest
        its manifest recorded when it was made."""
        rows = read_fresh(fresh)
        folder = self.folders["heldout"]
        shutil.rmtree(folder, ignore_errors=True)
        write_task_folder(rows, folder)
        kept = self.out / FRESH_COPY  # the split travels with the folder, to any machine
        kept.mkdir(exist_ok=True)
        for name in (MANIFEST, DATA):
            shutil.copyfile(fresh / name, kept / name)
        record = self.stages["synth"]
        record.setdefault("heldout_tasks_of_synthesis", record.get("heldout_tasks", []))
        record["heldout_tasks"] = sorted(r["id"] for r in rows)
        record["heldout_from"] = str(fresh)
        self.log(f"[synth] held-out: the {len(rows)} tasks of the fresh split {fresh}")

    def sft(self) -> None:
        recipe = (ROOT / self.args.sft_recipe).resolve()
        rows = self.stages["synth"]["sft_rows"]
        batch = recipe_value(recipe, "per_device_train_batch_size") * recipe_value(
            recipe, "gradient_accumulation_steps"
        )
        steps = math.ceil(math.ceil(rows / batch) * self.args.sft_epochs)
        argv = ["sft", "--config", str(recipe), "--dataset_path", str(self.out / "sft_data")]
        argv += ["--num_train_epochs", str(self.args.sft_epochs), "--output_dir", str(self.sft_dir)]
        argv += ["--save_strategy", "steps", "--save_steps", str(math.ceil(steps / 2))]
        argv += self.seed_flags("sft")
        if checkpoints(self.sft_dir):  # an interrupted run goes on from its last checkpoint
            argv += ["--resume_from_checkpoint", "true"]
        self.run("sft", argv, self.placements()[0])

    def select_sft(self) -> str:
        """The SFT checkpoint RL starts from: chosen on validation among the run's checkpoints,
        or, with ``--sft-candidates final``, its last one, fixed before the run (no sweep)."""
        found = checkpoints(self.sft_dir)
        if self.args.sft_candidates == "all" or self.done("select_sft"):
            return self.select("select_sft", found)
        if not found:
            raise SystemExit("select_sft: no checkpoint to choose from")
        self.stages["select_sft"] = {"chosen": str(found[-1]), "rule": "final checkpoint"}
        self.save()
        return str(found[-1])

    def select(self, stage: str, candidates: list[Path]) -> str:
        """The candidate with the best validation correct@1 (then compile rate; then the later
        one): the only place a setting is chosen, and it never sees the held-out tasks."""
        if self.done(stage):
            return self.stages[stage]["chosen"]
        if not candidates:
            raise SystemExit(f"{stage}: no checkpoint to choose from")
        if len(candidates) == 1 and not self.args.rl_variants:
            # Nothing to choose between, and no variant choice downstream needs its score: a
            # validation sweep would decide nothing (the learning protocol's step-15-only runs).
            chosen = str(candidates[0])
            self.stages[stage] = {"validation": {}, "chosen": chosen}
            self.save()
            self.log(f"[{stage}] the one candidate, not validated: {chosen}")
            return chosen
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

    def rl(self, sft_model: str) -> None:
        if self.args.rl_from:
            self.adopt_rl(self.args.rl_from)
            return
        train = self.curriculum(sft_model)
        argv = ["train", "--config", str(self.rl_recipe)]
        argv += ["--advantage", self.args.advantage]
        argv += ["--run_name", f"learning-{self.args.advantage}"]
        argv += ["--model_name_or_path", sft_model, "--tasks", f"parquet:{train}"]
        argv += ["--max_steps", str(self.args.rl_steps)]
        argv += ["--save_steps", str(self.args.rl_save_every)]
        argv += ["--output_dir", str(self.rl_dir), *self.seed_flags("rl")]
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
