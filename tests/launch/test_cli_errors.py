"""A user's mistake costs one line and exit status 2, never a traceback, and loses nothing on
disk: a file where a results folder should be, a model value that names nothing (a typo in a
kernelrl model name, a checkpoint folder that does not exist), a dead OpenAI-compatible endpoint.
Every case runs the real ``kernelrl`` entry point in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernelrl.launch.models import ModelResolutionError, check_model_value

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "recipes"
KEPT = "precious results, not a folder\n"


def kernelrl(args: list[str], cwd: Path) -> tuple[int, str]:
    """Exit status and stderr of ``python -m kernelrl.launch.cli ARGS`` (no hub, no wandb)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    proc = subprocess.run(
        [sys.executable, "-m", "kernelrl.launch.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.returncode, proc.stderr


def assert_one_line(code: int, err: str, prefix: str, *parts: str) -> str:
    assert code == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1, err[-3000:]
    assert lines[0].startswith(prefix + ": "), lines[0]
    for part in parts:
        assert part in lines[0], (part, lines[0])
    return lines[0]


# ------------------------------------------------------------------ a file as the output folder
@pytest.mark.parametrize(
    ("command", "recipe"),
    [
        ("eval", RECIPES / "eval" / "fixed_bundled.yaml"),
        ("curate", RECIPES / "curate" / "smoke_cpu.yaml"),
        ("sft", RECIPES / "smollm2" / "sft" / "smoke_cpu.yaml"),
    ],
)
@pytest.mark.parametrize("nested", [False, True], ids=["the-file", "under-the-file"])
def test_output_dir_that_is_a_file(
    tmp_path: Path, command: str, recipe: Path, nested: bool
) -> None:
    blocker = tmp_path / "x"
    blocker.write_text(KEPT)
    output_dir = blocker / "sub" if nested else blocker
    code, err = kernelrl(
        [command, "--config", str(recipe), "--output_dir", str(output_dir)], tmp_path
    )
    line = assert_one_line(code, err, f"kernelrl {command}", f"output_dir {output_dir}", "choose")
    assert (f"{output_dir} is a file, not a folder" in line) != nested
    assert (f"lies under {blocker}, which is a file" in line) == nested
    assert blocker.is_file() and blocker.read_text() == KEPT


def test_check_suite_json_out_under_a_file(tmp_path: Path) -> None:
    blocker = tmp_path / "x"
    blocker.write_text(KEPT)
    target = blocker / "results.jsonl"
    code, err = kernelrl(
        ["env", "check-suite", "--device", "cpu", "--tasks", "01_relu", "--json-out", str(target)],
        tmp_path,
    )
    assert_one_line(code, err, "kernelrl env check-suite", str(target), f"{blocker} is a file")
    assert blocker.is_file() and blocker.read_text() == KEPT


# ------------------------------------------------------------------ a model value naming nothing
@pytest.mark.parametrize(
    ("command", "args", "value"),
    [
        (
            "eval",
            ["--config", str(RECIPES / "eval" / "smoke_cpu.yaml"), "--output_dir", "out"],
            "smollm2-135m-instrct",
        ),
        (
            "sft",
            [
                "--config",
                str(RECIPES / "smollm2" / "sft" / "smoke_cpu.yaml"),
                "--output_dir",
                "out",
            ],
            "runs/sft/never_trained/final",
        ),
        (
            "curate",
            ["--config", str(RECIPES / "curate" / "smoke_cpu.yaml"), "--output_dir", "out"],
            "./models/missing",
        ),
        ("serve", ["--dry_run"], "SmolLM2"),
    ],
)
def test_unknown_model_is_one_line(
    tmp_path: Path, command: str, args: list[str], value: str
) -> None:
    flag = {"curate": "--pass_rate_model", "serve": "--model"}.get(command, "--model_name_or_path")
    code, err = kernelrl([command, *args, flag, value], tmp_path)
    assert_one_line(
        code,
        err,
        f"kernelrl {command}",
        repr(value),
        "smollm2-135m-instruct",
        "nothing is downloaded",
    )
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_model_values_that_may_work_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    for value in ("Qwen/Qwen3-8B", str(tmp_path / "runs"), "runs", "SmolLM2-135M-Instruct"):
        check_model_value(value)  # a hub id, folders, a known name in any case
    for value in ("runs/final", "gpt2-typo", "/no/such/checkpoint", "a/b/c"):
        with pytest.raises(ModelResolutionError, match="nothing is downloaded"):
            check_model_value(value)


# ------------------------------------------------------------------ a dead endpoint
@pytest.mark.parametrize("served_model_name", ["m", ""], ids=["named", "asks-the-server"])
def test_dead_openai_endpoint_names_the_url(tmp_path: Path, served_model_name: str) -> None:
    url = "http://127.0.0.1:9/v1"  # the discard port: nothing listens there
    recipe = tmp_path / "openai.yaml"
    recipe.write_text(
        "output_dir: out\nbenchmark: bundled\ntask_regex: '^01_relu$'\nbackend: triton\n"
        f"client: openai\napi_base: {url}\nserved_model_name: '{served_model_name}'\n"
        "samples: 1\npass_k: [1]\nenv_device: cpu\nenv_workers: 1\n"
    )
    code, err = kernelrl(["eval", "--config", str(recipe)], tmp_path)
    assert code == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    # The sweep's header (which names the endpoint) and progress come first; the cause is one
    # line, the last.
    causes = [line for line in err.strip().splitlines() if "Connection error" in line]
    assert len(causes) == 1 and err.strip().splitlines()[-1] == causes[0], err[-3000:]
    assert url in causes[0]
    assert causes[0].startswith("kernelrl eval: ") and "start one" in causes[0]
    # The cause is the endpoint, not the results folder: a dead endpoint (a ConnectionError,
    # hence an OSError) was once reported as a failed write of samples.jsonl with "free some
    # space" as the fix.
    for wrong in ("space", "cannot write", "samples.jsonl"):
        assert wrong not in causes[0], causes[0]


# ------------------------------------------------------------------ recipes: unknown keys, bad values
def test_unknown_recipe_key_before_the_bf16_check(tmp_path: Path) -> None:
    """Without ``use_cpu``, building TrainingArguments on a CPU fails on bf16; the typo comes
    first, named with the key it was meant to be."""
    recipe = tmp_path / "sft.yaml"
    recipe.write_text(
        "model_name_or_path: smollm2-135m-instruct\ndataset_path: data\noutput_dir: out\n"
        "max_stepz: 3\n"
    )
    code, err = kernelrl(["sft", "--config", str(recipe)], tmp_path)
    assert_one_line(code, err, "kernelrl: error", "max_stepz (did you mean max_steps?)", "--help")
    assert "bf16" not in err
    code, err = kernelrl(
        ["train", "--config", str(RECIPES / "smoke" / "cpu.yaml"), "--use_cpu", "false"]
        + ["--num_generatons", "2", "--output_dir", "out"],
        tmp_path,
    )
    assert_one_line(code, err, "kernelrl train: error", "--num_generatons", "num_generations")
    assert "bf16" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("command", "args", "key"),
    [
        (
            "eval",
            ["--config", str(RECIPES / "eval" / "fixed_bundled.yaml"), "--samples", "x"],
            "--samples",
        ),
        (
            "curate",
            ["--config", str(RECIPES / "curate" / "smoke_cpu.yaml"), "--dedup_ngram", "x"],
            "--dedup_ngram",
        ),
    ],
)
def test_bad_value_is_one_line_not_the_usage(
    tmp_path: Path, command: str, args: list[str], key: str
) -> None:
    code, err = kernelrl([command, *args, "--output_dir", "out"], tmp_path)
    assert_one_line(code, err, "kernelrl: error", key, "invalid int value: 'x'")
    assert "usage:" not in err
    assert not (tmp_path / "out").exists()


def test_bad_value_in_a_recipe_file(tmp_path: Path) -> None:
    recipe = tmp_path / "sft.yaml"
    recipe.write_text(
        (RECIPES / "smollm2" / "sft" / "smoke_cpu.yaml").read_text() + "\nmax_steps: many\n"
    )
    code, err = kernelrl(["sft", "--config", str(recipe), "--output_dir", "out"], tmp_path)
    assert_one_line(code, err, "kernelrl: error", "--max_steps", "'many'")


def test_sft_without_wandb_says_nothing_about_wandb(tmp_path: Path) -> None:
    """``report_to: none``: no "Running in WANDB offline mode" (transformers prints it whenever
    WANDB_MODE is offline), so nothing may set WANDB_MODE for such a run."""
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
    proc = subprocess.run(
        [sys.executable, "-m", "kernelrl.launch.cli", "sft"]
        + ["--config", str(RECIPES / "smollm2" / "sft" / "smoke_cpu.yaml")]
        + ["--output_dir", "out", "--dataset_path", str(tmp_path / "no_dataset")],
        cwd=tmp_path,
        env={**env, "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "WANDB" not in proc.stdout + proc.stderr


# ------------------------------------------------------------------ --help lists --config and every key
@pytest.mark.parametrize(
    ("words", "key"),
    [
        (["eval", "--help"], "--samples"),
        (["curate", "--help"], "--dedup_threshold"),
        (["sft", "--help"], "--dataset_path"),
        (["train", "--help"], "--advantage"),
        (["env", "serve", "--help"], "--logical_gpus"),
        (["serve", "--help"], "--gpu_memory_utilization"),
    ],
)
def test_help_lists_config_and_the_keys(
    words: list[str], key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from kernelrl.launch.cli import main

    try:
        code = main(words)
    except SystemExit as exc:  # argparse's help exits 0
        code = exc.code
    out = capsys.readouterr().out
    assert code == 0
    assert "--config RECIPE.yaml" in out and key in out


@pytest.mark.parametrize(
    ("command", "recipe", "old", "new"),
    [
        ("eval", "recipes/eval/smoke_cpu.yaml", "cache_db", "env_store_path"),
        ("eval", "recipes/eval/smoke_cpu.yaml", "eval_workers", "env_workers"),
        ("curate", "recipes/curate/smoke_cpu.yaml", "device", "env_device"),
        ("synth", "recipes/synth/synthetic_cpu.yaml", "pool", "env_pool"),
    ],
)
def test_the_old_pool_keys_name_the_new_ones(command, recipe, old, new, capsys) -> None:
    """Sweeps, curation and synthesis share training's pool keys (``EnvPoolConfig``); a
    recipe or flag of before is one line naming the key to set instead."""
    from kernelrl.launch.cli import main

    assert main([command, "--config", str(REPO / recipe), f"--{old}", "1"]) != 0
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{old} was replaced by {new}" in message


def test_a_training_failure_is_classified_without_vllm_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A machine without vLLM (a lent GPU machine) reports a failed run as itself: classifying
    the error must not import vLLM, which once replaced a missing-file error by its ImportError."""
    from kernelrl.data.loaders import LoaderError
    from kernelrl.launch.train_cli import lost_peer_message

    monkeypatch.setitem(sys.modules, "kernelrl.rl.server_sync", None)  # import fails, as there
    assert lost_peer_message(LoaderError("no Parquet file at x.parquet")) is None
    assert "unreachable" in lost_peer_message(ConnectionRefusedError("refused"))
