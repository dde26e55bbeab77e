"""`kernelrl curate --config recipes/curate/smoke_cpu.yaml` end to end, and its CLI errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from curate_smoke_run import RECIPE, smoke_curation

from kernelrl.data.loaders import load_curated
from kernelrl.data.schema import SFT_FEATURES, TASK_FEATURES, result_of
from kernelrl.launch.cli import main

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smoke() -> Path:
    out, process = smoke_curation()
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    return out


def removed(out: Path) -> dict[str, tuple[str, str]]:
    lines = (out / "removed.jsonl").read_text().splitlines()
    return {r["id"]: (r["step"], r["reason"]) for r in map(json.loads, lines)}


def test_every_bad_record_is_removed_for_its_reason(smoke: Path) -> None:
    assert removed(smoke) == {
        "not_a_task": ("normalize", "not_kernelbench"),
        "broken_syntax": ("normalize", "syntax_error"),
        "05_gelu_renamed": ("dedup", "exact_duplicate"),
        "09_mlp_block_variant": ("dedup", "near_duplicate"),
        "08_rms_norm_channels": ("decontaminate", "contaminated"),
        "04_crashing_reference": ("validate", "reference_crashes"),
        "06_log_of_inputs": ("validate", "non_finite_output"),
        "07_random_channel_drop": ("validate", "nondeterministic"),
        "rms/copied_task": ("attach_samples", "task_removed"),
        "crash/any": ("attach_samples", "task_removed"),
        "traj/resadd": ("trajectories_to_sft", "no_successful_revision"),
        "gelu/wrong": ("sft_select", "not_correct:incorrect"),
        "gelu/cheat": ("sft_select", "not_correct:integrity_violation"),
        "softmax/no_code": ("sft_select", "not_correct:format_error"),
        "gelu/long": ("sft_select", "over_task_cap"),
    }


def test_datasets_are_parquet_with_the_schemas(smoke: Path) -> None:
    tasks = load_curated(str(smoke), "tasks")
    assert tasks.features == TASK_FEATURES
    assert sorted(tasks["id"]) == [
        "01_gelu_tanh",
        "02_softmax_rows",
        "03_mlp_block",
        "resadd_layernorm",
    ]
    assert all(tasks["validated"]) and all(r > 0 for r in tasks["ref_runtime_ms"])
    assert all(tasks["difficulty"]) and all(tasks["op_categories"])
    sft = load_curated(str(smoke), "sft")
    assert sft.features == SFT_FEATURES
    by_id = {row["id"]: row for row in sft}
    # the concise gelu sample beat the long one; both revisions were kept
    assert set(by_id) == {
        "gelu/short",
        "softmax/ok",
        "resadd/ok",
        "traj/gelu/turn1",
        "traj/softmax/turn1",
    }
    for row in sft:
        assert row["correct"] and row["status"] == "correct" and not row["checks_failed"]
        assert result_of(row["result"]).correct and row["completion"][0]["role"] == "assistant"
        assert row["prompt"][0]["role"] == "system"
    revision = by_id["traj/softmax/turn1"]
    assert revision["kind"] == "revision" and [m["role"] for m in revision["prompt"]][-2:] == [
        "assistant",
        "user",
    ]
    assert "compile" in revision["prompt"][-1]["content"].lower()  # the environment's feedback


def test_card_reports_and_plots(smoke: Path) -> None:
    card = (smoke / "README.md").read_text()
    assert card.startswith("---\nconfigs:\n- config_name: tasks\n  data_files: tasks/*.parquet")
    assert "| tasks | 4 | tasks/*.parquet |" in card and "| sft | 5 | sft/*.parquet |" in card
    assert "| validate | 7 | 4 | 3 |" in card and "| decontaminate | 8 | 7 | 1 |" in card
    for plot in (
        "steps",
        "op_categories",
        "difficulty",
        "runtimes",
        "reasoning_tokens",
        "sft_per_task",
    ):
        assert (smoke / "plots" / f"{plot}.png").stat().st_size > 1000
        assert f"(plots/{plot}.png)" in card
    decontamination = (smoke / "decontamination.md").read_text()
    assert "08_rms_norm_channels | level1/36_channel_rms_scale | 1.00" in decontamination
    steps = json.loads((smoke / "steps.json").read_text())
    assert [s["step"] for s in steps][:5] == [
        "normalize",
        "dedup",
        "decontaminate",
        "validate",
        "difficulty",
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--config", "recipes/curate/nope.yaml"],
            "recipe recipes/curate/nope.yaml does not exist",
        ),
        (["--config", str(RECIPE), "--no_such_key", "1"], "no_such_key"),
        (
            ["--config", str(RECIPE), "--steps", "normalize", "shuffle"],
            "unknown curation steps ['shuffle']",
        ),
        ([], "usage: kernelrl curate --config RECIPE.yaml"),
    ],
)
def test_cli_errors_are_one_line_and_exit_2(args: list[str], message: str, capsys) -> None:
    assert main(["curate", *args]) == 2
    err = capsys.readouterr().err
    assert message in err
    if args:
        assert err.startswith("kernelrl: error: ") and err.strip().count("\n") == 0


def test_malformed_and_unknown_yaml_keys(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("output_dir: [unclosed\n")
    assert main(["curate", "--config", str(bad)]) == 2
    assert "malformed YAML" in capsys.readouterr().err
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("output_dir: x\ntask_sources: [a]\ndedup_treshold: 0.5\n")
    assert main(["curate", "--config", str(unknown)]) == 2
    assert "dedup_treshold" in capsys.readouterr().err
