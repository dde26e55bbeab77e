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
6. **generate_kb** and **judge_kb** (with ``--kernelbench-set``): the fixed KernelBench level-1
   set answered by the chosen SFT and RL models (and the base model, ``--kb-base``) where the
   models are, and judged afterwards, anywhere (``learning_kb.py``).
7. **report**: every judged answer of the held-out sweeps and the KernelBench set in
   ``answers.jsonl.gz`` (``learning_answers.py``), and the figures computed from those rows
   alone (``learning_figures.py``): correct@1, pass@k, format-error, token-limit, compile and
   integrity-violation rates and the mean reward at each stage with paired bootstrap 95%
   intervals, RL - SFT pooled over seeds, the by-operator counts, curves (SFT loss; RL reward,
   correct rate and lengths) in ``learning.png``, ``summary.json``, ``table.md`` and
   ``families.md``, copied to ``--results``. ``learning_recompute.py`` recomputes them from
   the answers, and pools the answers of runs made with other ``--run-seed``s.

The pre-registered protocol (``docs/learning-protocol.md``) runs this with ``--run-seed`` (SFT's,
RL's and the sweeps' seed), ``--heldout-from`` (a fresh held-out split, ``learning_fresh.py``),
``--sft-candidates final`` and ``--kernelbench-set``, one seed per GPU window
(``learning_seed.sh``).

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
import os
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning_bench import RL_STAGES, Benchmark  # noqa: E402
from learning_curriculum import CURRICULUM_SUFFIX  # noqa: E402
from learning_output import EVALS  # noqa: E402
from learning_run import BASE_MODEL, RECIPES, ROOT, checkpoints, recipe_value  # noqa: E402
from learning_tasks import kernelbench_sources  # noqa: E402

__all__ = [
    "BASE_MODEL",
    "EVALS",
    "RL_STAGES",
    "ROOT",
    "STAGES",
    "Benchmark",
    "build_parser",
    "checkpoints",
    "kernelbench_sources",
    "recipe_value",
    "stages_to_run",
]

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
    "generate_kb",
    "judge_kb",
    "report",
)


def default_kernelbench() -> Path | None:
    """A KernelBench checkout: ``KERNELBENCH_DIR``, else ``.kb/KernelBench`` where it exists."""
    if os.environ.get("KERNELBENCH_DIR"):
        return Path(os.environ["KERNELBENCH_DIR"])
    return ROOT / ".kb" / "KernelBench" if (ROOT / ".kb" / "KernelBench").is_dir() else None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _tasks_and_seeds(parser)
    _samples_and_sft(parser)
    _rl_arguments(parser)
    _running_arguments(parser)
    return parser


def _tasks_and_seeds(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="runs/bench/learning", help="working folder")
    parser.add_argument("--results", default="benchmarks/results/learning_cpu_v2")
    parser.add_argument(
        "--kernelbench",
        type=Path,
        default=default_kernelbench(),
        help="a KernelBench checkout (or its KernelBench/ folder; default KERNELBENCH_DIR), to "
        "decontaminate against (levels 1-3) and to read --kernelbench-set from",
    )
    parser.add_argument("--seed", type=int, default=0, help="synthesis, task samples, bootstrap")
    parser.add_argument(
        "--run-seed",
        type=int,
        default=None,
        help="the seed of this run's SFT, RL and sweeps, recorded with every answer (default: "
        "the recipes' own, recorded as 0); independent runs of the protocol differ by it",
    )
    parser.add_argument(
        "--heldout-from",
        type=Path,
        default=None,
        help="a fresh held-out split (learning_fresh.py): the held-out sweeps answer its tasks, "
        "checked against its manifest, instead of a sample of the synthesis's held-out split",
    )
    parser.add_argument(
        "--kernelbench-set",
        type=Path,
        default=None,
        help="a list of KernelBench level-1 files (recipes/smollm2/learning/kernelbench_level1.txt): "
        "copied from --kernelbench at synth, answered at generate_kb, judged at judge_kb",
    )
    parser.add_argument(
        "--kb-base", action="store_true", help="generate_kb also answers with the base model"
    )
    parser.add_argument(
        "--sft-candidates",
        choices=("all", "final"),
        default="all",
        help="select_sft: every SFT checkpoint validated and the best chosen, or the last one "
        "taken as fixed before the run (no validation sweep)",
    )


def _samples_and_sft(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--heldout-tasks", type=int, default=40)
    parser.add_argument("--validation-tasks", type=int, default=24)
    parser.add_argument("--samples", type=int, default=4, help="held-out samples per task (k)")
    parser.add_argument("--sft-epochs", type=float, default=1.0)
    parser.add_argument(
        "--sft-recipe",
        default=str(RECIPES.relative_to(ROOT) / "sft.yaml"),
        help="SFT's recipe (sft_gpu.yaml on a GPU machine: larger batches, bf16)",
    )


def _rl_arguments(parser: argparse.ArgumentParser) -> None:
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


def _running_arguments(parser: argparse.ArgumentParser) -> None:
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
        ("select_sft", bench.select_sft),
        ("eval_sft", lambda: bench.evaluate("eval_sft", bench.stages["select_sft"]["chosen"])),
        ("eval_base", lambda: bench.evaluate("eval_base", BASE_MODEL)),
        ("curriculum", lambda: bench.curriculum(bench.stages["select_sft"]["chosen"])),
        ("rl", lambda: bench.rl(bench.stages["select_sft"]["chosen"])),
        ("select_rl", lambda: bench.select(select_rl, checkpoints(bench.rl_dir))),
        ("select_variant", bench.select_variant),
        ("eval_rl", lambda: bench.evaluate(eval_rl, bench.stages[select_rl]["chosen"])),
        ("train_check", lambda: bench.train_check(bench.stages[select_rl]["chosen"])),
        ("generate_kb", bench.generate_kb),
        ("judge_kb", bench.judge_kb),
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
