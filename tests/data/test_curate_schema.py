"""Schemas and loaders: KernelBench folders, JSONL with field mapping, Parquet, saved datasets."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest

from kernelrl.data.curate.normalize import normalize_source, normalize_tasks
from kernelrl.data.loaders import (
    LoaderError,
    load_curated,
    load_samples,
    load_tasks,
    load_trajectories,
    map_fields,
    parse_source,
    raw_rows,
)
from kernelrl.data.schema import (
    SFT_FEATURES,
    TASK_FEATURES,
    TRAJECTORY_FEATURES,
    make_dataset,
    result_of,
)
from kernelrl.env.result import EvalResult, Status
from kernelrl.env.task import task_from_row

DATA = Path(__file__).parents[1] / "fixtures" / "curate"


def test_parse_source_forms() -> None:
    assert parse_source("kernelbench:some/dir").format == "kernelbench"
    hub = parse_source("hub:ScalingIntelligence/KernelBench#level_1")
    assert (hub.format, hub.path, hub.split) == (
        "hub",
        "ScalingIntelligence/KernelBench",
        "level_1",
    )
    assert parse_source(str(DATA / "samples.jsonl")).format == "jsonl"
    assert parse_source(str(DATA / "raw_tasks")).format == "kernelbench"
    mapped = parse_source('{"format": "jsonl", "path": "x.jsonl", "fields": {"source": "code"}}')
    assert mapped.fields == {"source": "code"}
    with pytest.raises(LoaderError, match="unknown source format"):
        parse_source({"format": "csv", "path": "x"})
    with pytest.raises(LoaderError, match="unknown source keys"):
        parse_source({"path": "x.jsonl", "colums": {}})


def test_kernelbench_folder_levels_and_ids(tmp_path: Path) -> None:
    for level in (1, 2):
        folder = tmp_path / "KernelBench" / f"level{level}"
        folder.mkdir(parents=True)
        (folder / f"{level}_task.py").write_text(
            (DATA / "raw_tasks" / "01_gelu_tanh.py").read_text()
        )
    rows = raw_rows(f"kernelbench:{tmp_path / 'KernelBench'}")
    assert [(r["id"], r["level"]) for r in rows] == [("level1/1_task", 1), ("level2/2_task", 2)]


def test_jsonl_field_mapping_and_bad_mapping() -> None:
    spec = {
        "format": "jsonl",
        "path": str(DATA / "extra_tasks.jsonl"),
        "fields": {"id": "name", "source": "code"},
    }
    tasks = load_tasks([spec])
    assert tasks.features == TASK_FEATURES
    assert tasks["id"] == ["resadd_layernorm", "not_a_task", "broken_syntax"]
    assert tasks["level"] == [2, 1, 1]
    with pytest.raises(LoaderError, match="no column 'snippet'"):
        load_tasks([{**spec, "fields": {"source": "snippet"}}])


def test_turn_field_mapping() -> None:
    row = {"task": "t", "steps": [{"text": "a", "fb": "f"}]}
    mapped = map_fields(
        row,
        {"task_id": "task", "turns": "steps", "turns.completion": "text", "turns.feedback": "fb"},
    )
    assert mapped["turns"][0]["completion"] == "a" and mapped["turns"][0]["feedback"] == "f"


def test_normalize_rejects_non_tasks_and_renames_repeated_ids() -> None:
    spec = {
        "format": "jsonl",
        "path": str(DATA / "extra_tasks.jsonl"),
        "fields": {"id": "name", "source": "code"},
    }
    tasks = load_tasks([spec, spec])
    kept, report = normalize_tasks(tasks)
    assert kept["id"] == ["resadd_layernorm", "resadd_layernorm~2"]
    assert sorted(r.reason for r in report.removed) == [
        "not_kernelbench",
        "not_kernelbench",
        "syntax_error",
        "syntax_error",
    ]
    row = kept[0]
    assert json.loads(row["sizes"]) == {"cpu": {"tokens": 10, "hidden": 96}}
    assert row["prompt"][-1]["role"] == "user" and "class Model" in row["prompt"][-1]["content"]
    task = task_from_row(row)
    assert (
        task.size_overrides("cpu") == {"tokens": 10, "hidden": 96} and task.hash == row["task_hash"]
    )
    assert normalize_source("a  \r\nb\t \r\n\r\n") == "a\nb\n"


def test_parquet_round_trip_keeps_features(tmp_path: Path) -> None:
    result = EvalResult(task_id="t", backend="triton", status=Status.CORRECT, speedup_vs_eager=1.5)
    sft = make_dataset(
        [
            {
                "id": "x",
                "task_id": "t",
                "prompt": "write a kernel",
                "completion": [{"role": "assistant", "content": "```python\n...\n```"}],
                "checks_failed": [],
                "result": result.to_dict(),
                "correct": True,
            }
        ],
        "sft",
    )
    (tmp_path / "sft").mkdir()
    sft.to_parquet(str(tmp_path / "sft" / "train-00000-of-00001.parquet"))
    back = load_curated(str(tmp_path), "sft")
    assert back.features == SFT_FEATURES
    assert back[0]["prompt"] == [{"role": "user", "content": "write a kernel"}]
    assert result_of(back[0]["result"]).speedup_vs_eager == 1.5
    # the same file through the generic loaders
    assert raw_rows(f"parquet:{tmp_path / 'sft'}")[0]["id"] == "x"


def test_saved_dataset_and_trajectories(tmp_path: Path) -> None:
    trajectories = load_trajectories([f"jsonl:{DATA / 'trajectories.jsonl'}"])
    assert trajectories.features == TRAJECTORY_FEATURES
    assert [len(t) for t in trajectories["turns"]] == [2, 2, 2]
    datasets.DatasetDict({"train": trajectories}).save_to_disk(str(tmp_path / "saved"))
    again = load_trajectories(
        [{"format": "disk", "path": str(tmp_path / "saved"), "split": "train"}]
    )
    assert again["id"] == trajectories["id"]
    samples = load_samples([f"jsonl:{DATA / 'samples.jsonl'}"])
    assert len(samples) == 9 and samples["result"] == [None] * 9
    with pytest.raises(LoaderError, match="does not exist"):
        load_samples(["jsonl:/nonexistent/samples.jsonl"])
