"""benchmarks/learning_output.py: the stage records a report keeps name no machine's folders.
A run prepared on one machine, trained on another and reported on a third records three sets
of absolute paths; the report writes each as ``BENCH`` or a path in the checkout."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from learning_output import portable  # noqa: E402


def test_every_machine_folder_becomes_the_run_folder_or_the_checkout(tmp_path: Path) -> None:
    out = tmp_path / "checkout" / "runs" / "seed_1"
    stages = {
        "synth": {
            "log": f"{out}/logs/synth.log",
            "argv": ["synth", "--config", "/home/a/kernelrl/recipes/x/synth.yaml"],
        },
        "sft": {"log": "/scratch/b/logs/sft.log", "argv": ["--output_dir", "/scratch/b/sft"]},
        "rl": {"log": "/scratch/b/rl_run/train.log"},
        "select": {"chosen": "/scratch/b/sft/checkpoint-150", "scores": {"/scratch/b/m": 1}},
        "eval": {"argv": ["--config", "/gpu/tree/recipes/eval.yaml"]},
    }
    settings = {"kernelbench": "/home/a/kernelrl/.kb/KernelBench", "out": str(out)}
    records, kept = portable(stages, out, settings)
    assert records["synth"] == {
        "log": "BENCH/logs/synth.log",
        "argv": ["synth", "--config", "recipes/x/synth.yaml"],
    }
    assert records["sft"]["argv"] == ["--output_dir", "BENCH/sft"]
    assert records["rl"]["log"] == "BENCH/rl_run/train.log"
    assert records["select"] == {"chosen": "BENCH/sft/checkpoint-150", "scores": {"BENCH/m": 1}}
    assert records["eval"]["argv"] == ["--config", "recipes/eval.yaml"]
    assert kept == {"kernelbench": ".kb/KernelBench", "out": "BENCH"}
