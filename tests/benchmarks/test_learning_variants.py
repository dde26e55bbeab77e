"""The learning benchmark's RL variants (``--rl-set`` with ``--rl-tag``): their stages sit beside
the others under their own names, their overrides reach the trainer, and the report labels them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from kernelrl.launch.eval_cli import parse_sweep_recipe as learning_generate_parser

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import learning  # noqa: E402
import learning_bench  # noqa: E402


def _bench(tmp_path: Path, *extra: str) -> learning.Benchmark:
    args = learning.build_parser().parse_args(["--out", str(tmp_path), *extra])
    return learning.Benchmark(args)


def test_a_tagged_variant_has_its_own_stages_and_passes_its_overrides(tmp_path: Path) -> None:
    bench = _bench(
        tmp_path,
        "--curriculum",
        "pass-rate",
        "--rl-set",
        "learning_rate=5e-5",
        "temperature=1.0",
        "--rl-tag",
        "hot",
    )
    assert bench.stage_name("eval_rl") == "eval_rl_passrate_hot"
    assert bench.rl_dir == tmp_path / "rl_model_passrate_hot"
    assert (
        bench.rl_label() == "after TRLOO, pass-rate curriculum, learning_rate=5e-5 temperature=1.0"
    )
    ran: dict[str, list[str]] = {}
    bench.curriculum = lambda model: tmp_path / "train.parquet"
    bench.run = lambda name, argv: ran.setdefault(name, argv)
    bench.rl("sft-model")
    argv = ran["rl_passrate_hot"]
    assert argv[argv.index("--learning_rate") + 1] == "5e-5"
    assert argv[argv.index("--temperature") + 1] == "1.0"
    assert argv[argv.index("--output_dir") + 1] == str(tmp_path / "rl_model_passrate_hot")
    store = argv[argv.index("--env_store_path") + 1]
    assert store == str(tmp_path / "rl_model_passrate_hot" / "env_results.sqlite")


def test_a_variant_that_overrides_the_advantage_is_named_after_it(tmp_path: Path) -> None:
    bench = _bench(tmp_path, "--rl-set", "advantage=grpo", "learning_rate=6e-4", "--rl-tag", "g")
    assert bench.rl_label() == "after GRPO, learning_rate=6e-4"


def test_the_report_labels_every_recorded_rl_run(tmp_path: Path) -> None:
    bench = _bench(tmp_path)
    bench.stages = {
        "eval_rl": {},
        "eval_rl_passrate_hot": {"label": "after TRLOO, pass-rate curriculum, temperature=1.0"},
        "eval_sft": {},
    }
    evals = bench.report_evals()
    assert evals["eval_rl"] == "after TRLOO"
    assert evals["eval_rl_passrate_hot"] == "after TRLOO, pass-rate curriculum, temperature=1.0"
    assert list(evals)[: len(learning.EVALS)] == list(learning.EVALS)


def test_the_train_check_samples_sft_and_rl_anew_on_rls_own_train_tasks(tmp_path: Path) -> None:
    import datasets

    rows = [{"id": f"task_{i}", "source": f"# task {i}\n"} for i in range(3)]
    (tmp_path / "curriculum").mkdir()
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "curriculum" / "data.parquet"))
    bench = _bench(tmp_path, "--curriculum", "pass-rate", "--rl-tag", "hot")
    bench.stages = {"select_sft": {"chosen": "sft-model"}}
    ran: dict[str, list[str]] = {}
    bench.run = lambda name, argv: ran.setdefault(name, argv)
    bench.train_check("rl-model")
    assert sorted(p.name for p in (tmp_path / "tasks" / "rl_train").iterdir()) == [
        "task_0.py",
        "task_1.py",
        "task_2.py",
    ]
    models = {name: argv[argv.index("--model_name_or_path") + 1] for name, argv in ran.items()}
    assert models == {"train_sft": "sft-model", "train_check_passrate_hot": "rl-model"}
    assert bench.train_check_table() == ""  # nothing sampled yet: no table


def _checkpoint(folder: Path, step: int, save_steps: int) -> None:
    import json

    folder.mkdir(parents=True)
    state = {"save_steps": save_steps, "log_history": [{"step": step, "reward": 0.5}]}
    (folder / "trainer_state.json").write_text(json.dumps(state))


def test_rl_from_adopts_the_scheduled_checkpoints_and_the_last(tmp_path: Path) -> None:
    """A time-limited GPU call's stop checkpoints (6, 13) are resume points, not candidates."""
    import json

    run = tmp_path / "gpu_run"
    for step in (5, 6, 10, 13, 15, 16):
        _checkpoint(run / f"checkpoint-{step}", step, save_steps=5)
    calls = [{"device": "NVIDIA H200", "recipe": "recipes/x/trloo_gpu.yaml", "exit_status": 0}]
    (run / "runs.json").write_text(json.dumps([{**c, "wall_s": 500.0} for c in calls * 2]))
    bench = _bench(tmp_path / "out", "--rl-from", str(run), "--rl-tag", "gpu")
    bench.run = lambda name, argv: pytest.fail(f"RL must not run here: {name}")
    bench.rl("sft-model")
    adopted = [p.name for p in learning.checkpoints(bench.rl_dir)]
    assert adopted == ["checkpoint-5", "checkpoint-10", "checkpoint-15", "checkpoint-16"]
    record = bench.stages["rl_gpu"]
    assert record["wall_s"] == 1000.0 and record["returncode"] == 0
    assert bench.rl_label() == "after TRLOO, NVIDIA H200, trloo_gpu.yaml"
    # Two runs of one recipe on one device differ by their ranks and the checkpoint chosen.
    record["runs"][0]["ranks"] = 2
    bench.stages["select_rl_gpu"] = {"chosen": str(bench.rl_dir / "checkpoint-15")}
    assert bench.rl_label() == "after TRLOO, 2 x NVIDIA H200, trloo_gpu.yaml, checkpoint-15"


def test_a_lora_checkpoint_is_evaluated_merged_into_the_sft_model(tmp_path: Path) -> None:
    """What ``kernelrl eval`` loads computes what the adapter on its SFT model computes."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    from kernelrl.launch.models import resolve_model

    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    torch.manual_seed(0)
    sft = tmp_path / "sft"
    AutoModelForCausalLM.from_config(config).save_pretrained(str(sft))
    AutoTokenizer.from_pretrained(resolve_model(learning.BASE_MODEL)).save_pretrained(str(sft))
    lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    adapted = get_peft_model(AutoModelForCausalLM.from_pretrained(str(sft)), lora)
    checkpoint = tmp_path / "rl" / "checkpoint-5"
    adapted.save_pretrained(str(checkpoint))

    bench = _bench(tmp_path / "out")
    bench.stages = {"select_sft": {"chosen": str(sft)}}
    merged = bench.model_folder(str(checkpoint))
    assert merged == str(checkpoint / "merged")
    assert bench.model_folder(str(sft)) == str(sft)  # a full checkpoint is loaded as it is
    tokens = torch.tensor([[1, 5, 9, 200, 7]])
    with torch.no_grad():
        expected = adapted(tokens).logits
        got = AutoModelForCausalLM.from_pretrained(merged)(tokens).logits
        plain = AutoModelForCausalLM.from_pretrained(str(sft))(tokens).logits
    assert torch.allclose(got, expected, atol=1e-5)
    assert not torch.allclose(got, plain, atol=1e-3)  # the adapter changed the model
    assert (checkpoint / "merged" / "tokenizer.json").exists()


def test_sweep_settings_reach_every_sweep_and_only_named_stages_run(tmp_path: Path) -> None:
    """A GPU machine's sweeps (``--eval-set``) override the recipe in every evaluation's command;
    ``--only`` runs the named stages and no other, up to ``--stop-after``."""
    bench = _bench(tmp_path, "--eval-set", "client=transformers", "env_device=cuda")
    argv = bench.eval_argv("model", tmp_path / "tasks", 4, tmp_path / "eval_sft")
    assert argv[argv.index("--client") + 1] == "transformers"
    assert argv[argv.index("--env_device") + 1] == "cuda"
    assert argv.index("--client") > argv.index("--config")  # after the recipe: it overrides it

    def stages(*extra: str) -> list[str]:
        return learning.stages_to_run(learning.build_parser().parse_args(list(extra)))

    assert stages("--only", "curriculum") == ["curriculum"]
    assert stages("--only", "report", "eval_sft", "rl") == ["eval_sft", "rl", "report"]
    assert stages("--only", "eval_sft", "report", "--stop-after", "eval_rl") == ["eval_sft"]
    assert stages() == list(learning.STAGES)


def test_the_rl_recipe_scores_the_stages_and_filters_the_curriculum(tmp_path: Path) -> None:
    """The GPU recipe has no difficulty filter, the CPU recipe keeps easy tasks; stages are
    scored with the reward training parses from the recipe, and a GPU recipe (bf16, which
    training refuses on a CPU box) still gives its reward here."""
    from kernelrl.launch.train_cli import parse_train_recipe

    gpu = _bench(tmp_path, "--rl-recipe", "recipes/smollm2/learning/trloo_gpu.yaml")
    cpu = _bench(tmp_path)
    assert learning.recipe_value(gpu.rl_recipe, "task_difficulty", default="") == ""
    assert learning.recipe_value(cpu.rl_recipe, "task_difficulty", default="") == "easy"
    training_args, _ = parse_train_recipe(["--config", str(cpu.rl_recipe)])
    assert cpu.reward_config == training_args.reward_config()
    assert gpu.reward_config.speedup_weight == 1.0
    with pytest.raises(KeyError):
        learning.recipe_value(gpu.rl_recipe, "task_difficulty")


def test_processes_sharing_a_folder_keep_each_others_records(tmp_path: Path) -> None:
    """One process per GPU runs its stages in one folder: neither write loses the other's."""
    first, second = _bench(tmp_path), _bench(tmp_path)
    first.stages["select_rl_gpu"] = {"chosen": "a"}
    first.save()
    second.stages["select_rl_gpu_hot"] = {"chosen": "b"}
    second.save()
    first.stages["eval_sft"] = {"wall_s": 1.0}
    first.save()
    on_disk = _bench(tmp_path).stages
    assert on_disk == {
        "select_rl_gpu": {"chosen": "a"},
        "select_rl_gpu_hot": {"chosen": "b"},
        "eval_sft": {"wall_s": 1.0},
    }
    assert first.stages == on_disk


def _validated(correct: float, compile_rate: float) -> dict:
    return {"validation": {"ck": {"correct": correct, "compile": compile_rate}}, "chosen": "ck"}


def test_the_variant_best_on_validation_is_chosen_and_ties_keep_the_recipe(
    tmp_path: Path,
) -> None:
    bench = _bench(tmp_path, "--rl-variants", "gpu", "gpu_hot", "gpu_cold")
    bench.stages = {
        "select_rl_gpu": _validated(0.25, 0.8),
        "select_rl_gpu_hot": _validated(0.3, 0.7),
        "select_rl_gpu_cold": _validated(0.3, 0.7),
    }
    assert bench.select_variant() == "gpu_hot"
    assert _bench(tmp_path).stages["select_variant"]["chosen"] == "gpu_hot"

    tie = _bench(tmp_path / "tie", "--rl-variants", "gpu", "gpu_hot")
    tie.stages = {"select_rl_gpu": _validated(0.3, 0.7), "select_rl_gpu_hot": _validated(0.3, 0.7)}
    assert tie.select_variant() == "gpu"


def test_a_variant_that_was_not_validated_is_left_out_of_the_choice(tmp_path: Path) -> None:
    bench = _bench(tmp_path, "--rl-variants", "gpu_hot", "gpu")
    bench.stages = {"select_rl_gpu": _validated(0.25, 0.8)}
    assert bench.select_variant() == "gpu"
    assert bench.stages["select_variant"]["not_validated"] == ["gpu_hot"]

    none = _bench(tmp_path / "none", "--rl-variants", "gpu", "gpu_hot")
    none.stages = {}
    with pytest.raises(SystemExit, match="no variant of"):
        none.select_variant()


def test_the_chosen_variants_row_says_it_was_chosen_on_validation(tmp_path: Path) -> None:
    bench = _bench(tmp_path, "--rl-tag", "gpu_hot", "--rl-set", "learning_rate=6e-4")
    bench.stages = {"select_variant": {"chosen": "gpu_hot"}}
    assert bench.rl_label() == "after TRLOO, learning_rate=6e-4, variant chosen on validation"


def test_the_sft_choice_is_recorded_at_its_path_on_this_machine(tmp_path: Path) -> None:
    bench = _bench(tmp_path)
    bench.stages = {"select_sft": {"chosen": "/cpu/checkpoint-60"}}
    bench.save()
    bench.relocate_sft("/gpu/sft")
    bench.relocate_sft("/gpu/sft")
    assert _bench(tmp_path).stages["select_sft"] == {
        "chosen": "/gpu/sft",
        "chosen_on_cpu_box": "/cpu/checkpoint-60",
    }


def test_synthesis_and_sft_take_the_gpu_machines_settings(tmp_path: Path) -> None:
    recipe = "recipes/smollm2/learning/sft_gpu.yaml"
    bench = _bench(tmp_path, "--synth-set", "reference_solutions=2400", "--sft-recipe", recipe)
    ran: dict[str, list[str]] = {}

    def run(name: str, argv: list[str], placement: object = None) -> None:
        ran[name] = argv
        bench.stages.setdefault(name, {"heldout_tasks": []})

    bench.run = run
    bench.synth()
    assert ran["synth"][ran["synth"].index("--reference_solutions") + 1] == "2400"
    bench.stages["synth"]["sft_rows"] = 2400
    bench.sft()
    argv = ran["sft"]
    assert argv[argv.index("--config") + 1] == str(learning.ROOT / recipe)
    # 2,400 rows in batches of 16: 150 steps, a candidate every 75
    assert argv[argv.index("--save_steps") + 1] == "75"


def test_a_choices_validation_sweeps_run_at_once_one_per_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With --sweep-gpus 0 1 the two candidates are validated together (each waits for the
    other at a barrier, which sequential sweeps would never pass), each on its own GPU and its
    half of the cores, and the better one is chosen."""
    import threading

    bench = _bench(tmp_path, "--sweep-gpus", "0", "1")
    bench.stages = {"select_sft": {"chosen": "sft-model"}}
    together = threading.Barrier(2, timeout=10)
    placed: dict[str, tuple[str, frozenset[int]]] = {}

    def fake_run_stage(name, argv, out, log, min_gb, placement=None, script=None):
        together.wait()
        placed[name] = (placement.gpu, placement.cores)
        return {"wall_s": 0.0, "returncode": 0}

    scores = {"val_rl_checkpoint-5": 0.5, "val_rl_checkpoint-10": 0.25}
    monkeypatch.setattr(learning_bench, "run_stage", fake_run_stage)
    monkeypatch.setattr(
        learning_bench,
        "attempts",
        lambda path, config: {"t": [{"correct": scores[path.parent.name], "compile": 1.0}]},
    )
    candidates = [tmp_path / "checkpoint-5", tmp_path / "checkpoint-10"]
    assert bench.select("select_rl", candidates) == str(candidates[0])
    assert sorted(gpu for gpu, _ in placed.values()) == ["0", "1"]
    first, second = (cores for _, cores in placed.values())
    if len(os.sched_getaffinity(0)) >= 2:
        assert first and second and not first & second
    assert {bench.stages[name]["argv"][0] for name in scores} == {"eval"}


def test_one_candidate_is_chosen_without_a_validation_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A validation sweep decides nothing with one checkpoint; with RL variants it still runs,
    since the variant choice reads every variant's validation score."""
    swept: list[str] = []

    def fake_run_stage(name, argv, out, log, min_gb, placement=None, script=None):
        swept.append(name)
        return {"wall_s": 0.0, "returncode": 0}

    monkeypatch.setattr(learning_bench, "run_stage", fake_run_stage)
    monkeypatch.setattr(
        learning_bench, "attempts", lambda path, config: {"t": [{"correct": 1.0, "compile": 1.0}]}
    )
    only = [tmp_path / "checkpoint-15"]
    bench = _bench(tmp_path / "plain")
    bench.stages = {"select_sft": {"chosen": "sft-model"}}
    assert bench.select("select_rl", only) == str(only[0])
    assert swept == [] and bench.stages["select_rl"] == {"validation": {}, "chosen": str(only[0])}
    bench = _bench(tmp_path / "variants", "--rl-variants", "a", "b")
    bench.stages = {"select_sft": {"chosen": "sft-model"}}
    bench.model_folder = lambda checkpoint: checkpoint
    assert bench.select("select_rl", only) == str(only[0])
    assert swept == ["val_rl_checkpoint-15"]
    assert bench.stages["select_rl"]["validation"][str(only[0])]["correct"] == 1.0


def test_beyond_references_trains_on_the_chains_no_reference_showed(tmp_path: Path) -> None:
    import datasets

    train = tmp_path / "synth" / "tasks" / "train"
    train.mkdir(parents=True)
    combos = {"short": "relu>sum", "edge": "relu>exp>sum", "long": "relu>exp>sum>neg>abs"}
    rows = [{"id": task, "combination": combo} for task, combo in combos.items()]
    datasets.Dataset.from_list(rows).to_parquet(str(train / "data.parquet"))
    recipe = tmp_path / "synth" / "recipe.json"
    bench = _bench(tmp_path, "--curriculum", "beyond-references", "--rl-tag", "hot")
    assert bench.stage_name("eval_rl") == "eval_rl_beyond_hot"
    assert bench.rl_label() == "after TRLOO, beyond-references curriculum"
    recipe.write_text('{"reference_max_pointwise": 0}')
    with pytest.raises(SystemExit, match="no reference tier"):
        bench.curriculum("sft-model")
    recipe.write_text('{"reference_max_pointwise": 2}')
    parquet = bench.curriculum("sft-model")
    assert [row["id"] for row in datasets.Dataset.from_parquet(str(parquet))] == ["long"]
    assert bench.stages["curriculum"]["kept"] == ["long"]


@pytest.mark.parametrize("pointed_at", ["repository", "its KernelBench folder"])
def test_kernelbench_is_found_from_the_checkout_or_its_levels_folder(
    tmp_path: Path, pointed_at: str
) -> None:
    levels = tmp_path / "KernelBench" / "KernelBench"
    for n in (1, 2, 3):
        (levels / f"level{n}").mkdir(parents=True)
    root = tmp_path / "KernelBench" if pointed_at == "repository" else levels
    assert learning.kernelbench_sources(root) == [
        f"kernelbench:{levels}/level{n}" for n in (1, 2, 3)
    ]


def test_a_folder_without_kernelbench_levels_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="level1"):
        learning.kernelbench_sources(tmp_path)


def test_the_kernelbench_set_is_answered_where_the_models_are_and_judged_later(
    tmp_path: Path,
) -> None:
    """generate_kb runs the generator (no judging) for the chosen SFT and RL checkpoints, and
    the base model only when asked; judge_kb replays each set of completions it finds."""
    bench = _bench(tmp_path, "--rl-tag", "protocol", "--run-seed", "2", "--kb-base")
    (tmp_path / "tasks" / "kernelbench").mkdir(parents=True)
    bench.stages = {"select_sft": {"chosen": "/sft"}, "select_rl_protocol": {"chosen": "/rl"}}
    ran: dict[str, tuple[list[str], Path | None]] = {}
    bench.run = lambda name, argv, placement=None, script=None: ran.setdefault(name, (argv, script))
    bench.generate_kb()
    # in this order: a window cut short loses what comes last (kb_models says why RL is first)
    assert list(ran) == ["generate_kb_base", "generate_kb_rl", "generate_kb_sft"]
    argv, script = ran["generate_kb_rl"]
    assert script is not None and script.name == "learning_generate.py"
    assert argv[argv.index("--model_name_or_path") + 1] == "/rl"
    assert argv[argv.index("--output_dir") + 1] == str(tmp_path / "generated" / "kb_rl")
    assert argv[argv.index("--seed") + 1] == "202"  # the run's sweeps: R + 200
    config = learning_generate_parser(argv)  # the generator itself accepts what it is given
    assert config.model_name_or_path == "/rl" and config.seed == 202
    ran.clear()
    folder = tmp_path / "generated" / "kb_sft"
    folder.mkdir(parents=True)
    (folder / "completions.jsonl").write_text("")
    bench.judge_kb()
    assert list(ran) == ["kb_sft"]
    argv, script = ran["kb_sft"]
    assert script is None and argv[argv.index("--client") + 1] == "fixed"
    assert argv[argv.index("--fixed_solutions") + 1] == str(folder / "completions.jsonl")
    no_base = _bench(tmp_path / "other", "--rl-tag", "protocol")
    no_base.stages = {"select_sft": {"chosen": "/sft"}}
    assert list(no_base.kb_models()) == ["kb_sft"]
