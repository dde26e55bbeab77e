"""The learning benchmark's report, mixed into ``learning_bench.Benchmark``: every judged answer
of the held-out sweeps and of the KernelBench set as ``answers.jsonl.gz``, and the figures
computed from those rows (``learning_figures``) as ``summary.json``, ``table.md``,
``families.md`` and ``learning.png``, in the run folder and in ``--results``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from learning_answers import ANSWERS_FILE, answer_rows, stage_role, write_answers
from learning_families import operator_markdown
from learning_figures import figures
from learning_fresh import FRESH_COPY, fresh_parquet
from learning_kb import KB_STAGES
from learning_report import POOLED_RESAMPLES, POOLED_SEED, markdown, plot, rl_curve, sft_curve
from learning_run import ROOT, meminfo_gb
from learning_tasks import kernelbench_operators, task_operators

EVALS = {
    "eval_base": "before SFT",
    "eval_sft": "after SFT",
    "eval_rl": "after TRLOO",
    "eval_rl_grpo": "after GRPO",
    "eval_rl_passrate": "after TRLOO, pass-rate curriculum",
}


def portable(stages: dict[str, Any], out: Path, *more: Any) -> list[Any]:
    """The stage records (and ``more`` records of the same run) with the folders they ran in written as ``BENCH`` (the run folder) and
    repository-relative paths: the records are read on other machines, and the folders of the
    one that made them mean nothing there. A stage's folders are found from its own record
    (its log lives one level under the run folder; its recipe under the checkout's recipes/)."""
    benches, checkouts = {str(out.resolve()), str(out)}, {str(ROOT)}
    for record in stages.values():
        if isinstance(record, dict) and record.get("log"):
            benches.add(str(Path(record["log"]).parents[1]))
        for word in record.get("argv", []) if isinstance(record, dict) else []:
            if "/recipes/" in str(word):
                checkouts.add(str(word).split("/recipes/")[0])
    swaps = [(b, "BENCH") for b in benches] + [(c + "/", "") for c in checkouts]
    swaps.sort(key=lambda swap: -len(swap[0]))  # a run folder inside the checkout goes first

    def rewrite(value: Any) -> Any:
        if isinstance(value, dict):
            return {rewrite(k): rewrite(v) for k, v in value.items()}
        if isinstance(value, list):
            return [rewrite(v) for v in value]
        if isinstance(value, str):
            for old, new in swaps:
                value = value.replace(old, new)
        return value

    return [rewrite(value) for value in (stages, *more)]


class ReportStages:
    """The report stage (``Benchmark`` provides the state it uses)."""

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

    def run_seed(self) -> int:
        """The seed recorded with every answer: ``--run-seed``, or 0, the recipes' own seed."""
        return 0 if self.args.run_seed is None else self.args.run_seed

    def split_of(self) -> Callable[[str], str]:
        """task id -> the split its answers are recorded under."""
        synth = self.stages.get("synth", {})
        heldout = "heldout_fresh" if synth.get("heldout_from") else "heldout"
        splits = {t: "validation" for t in synth.get("validation_tasks", [])}
        splits |= {t: heldout for t in synth.get("heldout_tasks", [])}
        splits |= {t: "kernelbench_level1" for t in synth.get("kernelbench_tasks", [])}
        return lambda task: splits.get(task, "train")

    def operators(self) -> dict[str, str]:
        """task id -> the operator its by-operator row counts it under."""
        synth = self.stages.get("synth", {})
        parquets = [
            self.synth_dir / "tasks" / s / "data.parquet" for s in ("validation", "heldout")
        ]
        if synth.get("heldout_from"):
            parquets.append(fresh_parquet(self.out / FRESH_COPY))
        operators = task_operators(parquets)
        return operators | kernelbench_operators(synth.get("kernelbench_families", {}))

    def answers(self, evals: dict[str, str]) -> list[dict[str, Any]]:
        """Every answer of the held-out sweeps (``evals``' stages) and of the KernelBench set's
        judged stages, as answer rows, in the report's stage order."""
        rl_stage = self.stage_name("eval_rl")
        split_of, operators = self.split_of(), self.operators()
        rows = []
        for stage in [*evals, *KB_STAGES]:
            samples = self.out / stage / "samples.jsonl"
            if samples.exists():
                rows += answer_rows(
                    samples,
                    self.reward_config,
                    seed=self.run_seed(),
                    stage=stage_role(stage, rl_stage),
                    stage_name=stage,
                    split_of=split_of,
                    operators=operators,
                )
        return rows

    def labels(self, evals: dict[str, str]) -> dict[str, str]:
        """A row label for each stage of the answers (``stage_role``'s names)."""
        rl_stage = self.stage_name("eval_rl")
        labels = {stage_role(stage, rl_stage): label for stage, label in evals.items()}
        labels["rl"] = self.stages.get(rl_stage, {}).get("label", evals.get(rl_stage, "after RL"))
        return labels

    def report(self) -> None:
        """The answers first, then every figure from them: what the summary says is what
        ``learning_recompute.py`` can recompute from ``answers.jsonl.gz``."""
        evals = self.report_evals()
        rows = self.answers(evals)
        found = figures(rows, self.args.resamples, self.args.seed)
        seed = str(self.run_seed())
        table = dict(found["per_seed"][seed])
        table |= {k: v for k, v in found.items() if k != "per_seed"}
        table["per_seed"] = found["per_seed"]
        table["seed"] = self.run_seed()
        table["bootstrap"] = {
            "table": {"resamples": self.args.resamples, "seed": self.args.seed},
            "pooled": {"resamples": POOLED_RESAMPLES, "seed": POOLED_SEED},
        }
        table["answers"] = {"file": ANSWERS_FILE, "rows": len(rows)}
        table["machine"] = {
            "cpu_count": os.cpu_count(),
            "memory_gb": round(meminfo_gb("MemTotal", math.nan), 1),
        }
        settings = {k: str(v) for k, v in vars(self.args).items()}
        table["stage_runs"], table["settings"] = portable(self.stages, self.out, settings)
        labels = self.labels(evals)
        text = report_markdown(found, seed, labels, self.stages)
        families = operator_markdown(found["families"][seed], labels)
        train_text = self.train_check_table()
        results = (ROOT / self.args.results).resolve()
        results.mkdir(parents=True, exist_ok=True)
        for folder in (self.out, results):
            write_answers(folder / ANSWERS_FILE, rows)
            (folder / "summary.json").write_text(json.dumps(table, indent=1))
            (folder / "table.md").write_text(text)
            (folder / "families.md").write_text(families)
            if train_text:
                (folder / f"train_check{self.suffix}.md").write_text(train_text)
            self.plot_curves(table, labels, folder / "learning.png")
        self.log("\n" + text + ("\n" + train_text if train_text else ""))
        self.log(f"report in {results}")

    def plot_curves(self, table: dict[str, Any], labels: dict[str, str], path: Path) -> None:
        """The held-out bars beside the SFT loss and each RL run's training curves."""
        rl_stage = self.stage_name("eval_rl")
        rl_runs = {}
        for stage, label in labels.items():
            name = rl_stage if stage == "rl" else stage
            if name.startswith("eval_rl"):
                folder = self.out / f"rl_model{name.removeprefix('eval_rl')}"
                rl_runs[label.removeprefix("after ")] = rl_curve(folder)
        plot(
            table,
            labels,
            sft_curve(self.sft_dir / "sft_summary.json"),
            rl_runs,
            path,
            "SmolLM2-135M-Instruct on held-out synthetic tasks: before SFT, after SFT, after RL",
        )


def report_markdown(
    found: dict[str, Any], seed: str, labels: dict[str, str], stage_runs: dict[str, Any]
) -> str:
    """The run's held-out table, its pooled line and the KernelBench set's table."""
    text = markdown(found["per_seed"][seed], labels, stage_runs)
    if found["pooled"] is not None:
        text += "\n" + pooled_markdown(found["pooled"]) + "\n"
    kb = found["kernelbench"].get(seed)
    if kb is not None:
        text += "\nKernelBench level-1 set:\n\n"
        text += kb["error"] + "\n" if "error" in kb else markdown(kb, labels, {}, "KernelBench")
    return text


def pooled_markdown(pooled: dict[str, Any]) -> str:
    """One line per seed and the pooled line: RL - SFT correct@1 with its interval."""
    k = pooled["k"]
    lines = [
        f"RL - SFT, correct@1 over {k} samples per task (paired by task; pooled: seeds and tasks "
        f"resampled, {pooled['resamples']} resamples, bootstrap seed {pooled['bootstrap_seed']}):",
        "",
        f"| seed | tasks | SFT | RL | RL - SFT [95%] | pass@{k} difference [95%] |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]

    def line(name: str, entry: dict[str, Any]) -> str:
        pass_k = entry[f"pass@{k}"]
        return (
            f"| {name} | {entry['cells']} | {entry['sft']:.3f} | {entry['rl']:.3f} | "
            f"{entry['gain']:+.3f} [{entry['ci_low']:+.3f}, {entry['ci_high']:+.3f}] | "
            f"{pass_k['gain']:+.3f} [{pass_k['ci_low']:+.3f}, {pass_k['ci_high']:+.3f}] |"
        )

    lines += [line(seed, entry) for seed, entry in pooled["per_seed"].items()]
    lines.append(line(f"pooled ({len(pooled['seeds'])} seeds)", pooled))
    return "\n".join(lines) + "\n"
