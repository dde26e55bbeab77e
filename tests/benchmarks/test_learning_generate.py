"""benchmarks/learning_generate.py: a sweep's completions without its judging, for the
KernelBench set answered where the models are and judged elsewhere. A tiny randomly initialised
model with SmolLM2's tokenizer generates on CPU (what it writes is noise; how it is asked and
recorded is the point): one first-turn request per (task, sample) in a sweep's order with the
sweep's per-sample seeds, and rows that ``kernelrl eval --client fixed`` replays with their
``finish_reason``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kernelrl.data.bundled import TASKS_DIR
from kernelrl.eval.fixed import FixedSolutions
from kernelrl.eval.sweep import sample_seed
from kernelrl.launch.eval_cli import load_tasks, parse_sweep_recipe

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import learning_generate  # noqa: E402
from learning_run import BASE_MODEL, RECIPES  # noqa: E402


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    from kernelrl.launch.models import resolve_model

    folder = tmp_path_factory.mktemp("tiny")
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(str(folder))
    AutoTokenizer.from_pretrained(resolve_model(BASE_MODEL)).save_pretrained(str(folder))
    return folder


def _argv(model: Path, out: Path) -> list[str]:
    argv = ["--config", str(RECIPES / "eval_heldout.yaml"), "--client", "transformers"]
    argv += ["--model_name_or_path", str(model), "--benchmark", "folder"]
    argv += ["--benchmark_path", str(TASKS_DIR), "--task_regex", "^(01_relu|06_row_sum)$"]
    argv += ["--samples", "2", "--max_tokens", "6", "--seed", "7", "--output_dir", str(out)]
    return argv


def test_completions_are_asked_as_a_sweep_asks_and_replayable(tiny_model, tmp_path) -> None:
    out = tmp_path / "generated"
    assert learning_generate.main(_argv(tiny_model, out)) == 0
    rows = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    config = parse_sweep_recipe(_argv(tiny_model, out))
    planned = learning_generate.requests(config, load_tasks(config))
    order = [(r["task_id"], r["sample"]) for r in rows]
    assert order == [("01_relu", 0), ("01_relu", 1), ("06_row_sum", 0), ("06_row_sum", 1)]
    assert [r.seed for r in planned] == [sample_seed(7, t, s, 0) for t, s in order]
    assert all(
        r.messages[-1]["role"] == "user" and "class Model" in r.messages[-1]["content"]
        for r in planned
    )
    assert {r["finish_reason"] for r in rows} <= {"length", "stop"}
    assert all(r["completion_tokens"] <= 6 for r in rows)
    fixed = FixedSolutions([out / "completions.jsonl"], ["01_relu", "06_row_sum"])
    assert fixed.samples_for("01_relu") == 2 and not fixed.unmatched
    assert fixed.recorded[("06_row_sum", 1, 0)]["finish_reason"] == rows[3]["finish_reason"]
    # a second call keeps what exists: completions are generated once
    assert learning_generate.main(_argv(tiny_model, out)) == 0
    assert len((out / "completions.jsonl").read_text().splitlines()) == 4


def test_a_client_that_does_not_generate_is_refused(tmp_path) -> None:
    argv = _argv(tmp_path, tmp_path / "out")
    argv[argv.index("transformers")] = "fixed"
    with pytest.raises(SystemExit, match="does not generate"):
        learning_generate.main([*argv, "--fixed_solutions", str(tmp_path)])
