"""The learning benchmark's curricula (which train tasks RL draws from) and its train check
(whether RL learned even the tasks it trained on), mixed into ``learning_bench.Benchmark``.

Every choice here is made on train tasks only: validation and held-out tasks never reach it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from learning_answers import attempts
from learning_report import estimate, markdown
from learning_run import recipe_value
from learning_tasks import sample_rows, write_task_folder

#: The suffix of the RL stages trained on each curriculum's tasks.
CURRICULUM_SUFFIX = {"difficulty": "", "pass-rate": "_passrate", "beyond-references": "_beyond"}


class CurriculumStages:
    """The curriculum and train-check stages (``Benchmark`` provides the state they use)."""

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

        difficulty = recipe_value(self.rl_recipe, "task_difficulty", default="")
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
