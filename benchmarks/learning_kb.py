"""The fixed KernelBench level-1 set, mixed into ``learning_bench.Benchmark``: answered by the
base, SFT and RL models with the held-out sweeps' prompt and sampling, and judged.

Answering and judging are two stages because they run on two machines. ``generate_kb`` runs
where the models are (a GPU machine, whose SFT model never leaves it): each model's completions
of the set's tasks (``learning_generate.py``: the sweep's own prompts, per-sample seeds and
generation client), a minute per model. ``judge_kb`` runs anywhere afterwards: those completions
replayed through ``kernelrl eval --client fixed``, so the environment judges them exactly as it
judges a sweep's, at the sizes of the machine it runs on (on a CPU box the environment derives
sizes that fit the Triton interpreter; ``docs/learning-protocol.md`` says which were used).
KernelBench's published level-1 sizes (tensors of 6-16 GiB) would take a GPU several minutes a
model to judge, which a per-seed GPU window does not have.
"""

from __future__ import annotations

from pathlib import Path

from learning_run import BASE_MODEL, ROOT

#: The set's stages and their row labels.
KB_STAGES = {"kb_base": "before SFT", "kb_sft": "after SFT", "kb_rl": "after RL"}
GENERATOR = ROOT / "benchmarks" / "learning_generate.py"
COMPLETIONS = "completions.jsonl"


class KernelBenchStages:
    """The KernelBench set's stages (``Benchmark`` provides the state they use)."""

    def kb_models(self) -> dict[str, str]:
        """stage -> the model it answers with, in the order they answer: the base model with
        ``--kb-base``, then the chosen RL checkpoint, then the chosen SFT one.

        RL before SFT: the set is answered last in a run's window, over a minute a model, and
        a window cut short loses what comes last; the set after RL is the one the learning
        protocol had fewest of (``docs/learning-protocol.md``, "Deviations")."""
        models = {"kb_base": BASE_MODEL} if self.args.kb_base else {}
        select_rl = self.stages.get(self.stage_name("select_rl"))
        if select_rl is not None:
            models["kb_rl"] = select_rl["chosen"]
        if "select_sft" in self.stages:
            models["kb_sft"] = self.stages["select_sft"]["chosen"]
        return models

    def kb_completions(self, stage: str) -> Path:
        """Where a stage's unjudged completions are: what comes back from the GPU machine."""
        return self.out / "generated" / stage / COMPLETIONS

    def generate_kb(self) -> None:
        """Each model's completions of the set's tasks, not judged here."""
        folder = self.folders["kernelbench"]
        if not folder.is_dir():
            raise SystemExit(f"generate_kb: no {folder} (learning.py --kernelbench-set at synth)")
        for stage, model in self.kb_models().items():
            output = self.kb_completions(stage).parent
            argv = self.eval_argv(self.model_folder(model), folder, self.args.samples, output)
            # The generator is a script, not the CLI: it takes the sweep's words without the
            # ``eval`` subcommand.
            self.run(f"generate_{stage}", argv[1:], script=GENERATOR)

    def judge_kb(self) -> None:
        """Every set of completions ``generate_kb`` wrote, judged by the environment."""
        folder = self.folders["kernelbench"]
        for stage in KB_STAGES:
            completions = self.kb_completions(stage)
            if not completions.exists():
                continue
            model = self.stages.get(f"generate_{stage}", {}).get("argv", [])
            name = model[model.index("--model_name_or_path") + 1] if model else stage
            argv = self.eval_argv(name, folder, self.args.samples, self.out / stage)
            argv += ["--client", "fixed", "--fixed_solutions", str(completions)]
            self.run(stage, argv)
