"""`kernelrl sft` smoke: SmolLM2-135M trains on the curated smoke dataset on CPU."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from curate_smoke_run import ROOT, run_cli, smoke_curation
from safetensors import safe_open

from kernelrl.launch.cli import main

RECIPE = ROOT / "recipes" / "smollm2" / "sft" / "smoke_cpu.yaml"


def sft(curated: Path, out: Path, *extra: str):
    """The CPU smoke SFT recipe on one curated example (three steps)."""
    args = ["--dataset_path", str(curated), "--output_dir", str(out), "--max_train_samples", "1"]
    return run_cli("sft", "--config", str(RECIPE), *args, *extra, timeout=1200)


@pytest.mark.slow
def test_sft_smoke_learns_on_the_curated_dataset(tmp_path: Path) -> None:
    curated, process = smoke_curation()
    assert process.returncode == 0, process.stderr[-3000:]
    out = tmp_path / "sft"
    # One example, three steps: the loss on it must fall, and the saved weights must differ.
    process = sft(curated, out, "--save_strategy", "steps", "--save_steps", "2")
    assert process.returncode == 0, process.stdout[-2000:] + process.stderr[-4000:]
    summary = json.loads((out / "sft_summary.json").read_text())
    assert summary["global_step"] == 3 and summary["train_rows"] == 1
    losses = [entry["loss"] for entry in summary["log_history"] if "loss" in entry]
    assert len(losses) == 3 and all(math.isfinite(loss) for loss in losses)
    assert losses[-1] < losses[0]
    assert "loss" in process.stdout and "model saved to" in process.stdout
    base = Path(summary["model"]) / "model.safetensors"
    with (
        safe_open(str(base), "pt") as before,
        safe_open(str(out / "model.safetensors"), "pt") as after,
    ):
        name = next(k for k in before.keys() if "layers.0.self_attn.q_proj" in k)  # noqa: SIM118
        assert not before.get_tensor(name).equal(after.get_tensor(name))

    # Resumed from its step-2 checkpoint, the run repeats step 3 exactly (weights, optimizer,
    # scheduler and data position restored by TRL's checkpoint).
    process = sft(curated, out, "--resume_from_checkpoint", str(out / "checkpoint-2"))
    assert process.returncode == 0, process.stdout[-2000:] + process.stderr[-4000:]
    resumed = json.loads((out / "sft_summary.json").read_text())
    assert resumed["global_step"] == 3
    step_3 = [e["loss"] for e in resumed["log_history"] if "loss" in e and e["step"] == 3]
    assert step_3 == [pytest.approx(losses[-1], rel=1e-4)]

    # A max_length that leaves no completion token is a clear error, not a trainer crash.
    process = sft(curated, tmp_path / "too_short", "--max_length", "64")
    assert process.returncode == 2 and "raise max_length" in process.stderr


def test_sft_rejects_a_dataset_without_sft_rows(tmp_path: Path, capsys) -> None:
    (tmp_path / "data.jsonl").write_text('{"id": "x", "source": "import torch"}\n')
    code = main(
        [
            "sft",
            "--config",
            str(RECIPE),
            "--dataset_path",
            str(tmp_path / "data.jsonl"),
            "--output_dir",
            str(tmp_path / "o"),
        ]
    )
    assert code == 2
    assert "not an SFT dataset" in capsys.readouterr().err


def test_sft_recipe_errors(capsys) -> None:
    assert main(["sft", "--config", "recipes/smollm2/sft/missing.yaml"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["sft", "--config", str(RECIPE), "--learning_rte", "1"]) == 2
    assert "learning_rte" in capsys.readouterr().err
