"""benchmarks/learning_fresh.py: a fresh held-out split, drawn with another seed from the
training synthesis's own recipe, kept apart from every split of it (combinations, computations
and text), checked against its manifest wherever it is used, and made once."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kernelrl.data.synth.config import synth_config
from kernelrl.data.synth.pipeline import run_synthesis

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import learning  # noqa: E402
import learning_fresh  # noqa: E402

BENCHMARK = Path(__file__).parents[1] / "fixtures" / "curate" / "benchmark"
pytestmark = pytest.mark.slow


def _row(task_id: str, combination: str, split: str = "train") -> dict:
    return {"id": task_id, "combination": combination, "split": split, "source": ""}


def test_only_what_could_have_been_held_out_and_was_not_drawn_is_kept() -> None:
    training = [
        _row("a", "relu>exp>sum>neg>abs"),
        _row("b", "tanh>softmax"),
        _row("c", "neg>abs>sum>relu>relu", "heldout"),
        _row("d", "sigmoid>sum", "validation"),
    ]
    fresh = [
        _row("keep", "tanh>relu>softmax>neg>abs"),
        _row("short", "relu>softmax>neg"),  # within the reference tier (3 pointwise)
        _row("trained", "relu>exp>sum>neg>abs"),
        _row("held", "neg>abs>sum>relu>relu"),  # the old held-out split's combination
        _row("unseen_op", "tanh>relu>softmax>neg>silu"),  # silu: never in train
        _row("validated", "sigmoid>sum", "train"),
    ]
    kept, removed = learning_fresh.apart_from_training(fresh, training, min_pointwise=4)
    assert [row["id"] for row in kept] == ["keep"]
    assert removed == {
        "within the reference tier": 2,
        "combination in the training synthesis": 2,
        "an operator never in training": 1,
    }


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("fresh")
    training = synth_config(
        output_dir=str(tmp / "train" / "synth"),
        num_tasks=150,
        seed=0,
        families=["elementwise", "reduction", "softmax", "norm"],
        max_pointwise=5,
        reference_max_pointwise=2,
        sandbox_sample=0,
        reference_solutions=0,
        benchmark_sources=[f"kernelbench:{BENCHMARK}"],
    )
    run_synthesis(training)
    fresh = tmp / "fresh"
    argv = ["--train-synth", str(tmp / "train" / "synth"), "--out", str(fresh)]
    assert learning_fresh.main([*argv, "--seed", "1", "--num-tasks", "150", "--tasks", "4"]) == 0
    return tmp / "train", fresh


def test_the_fresh_split_is_apart_from_every_training_split(made) -> None:
    import datasets

    train, fresh = made
    manifest = json.loads((fresh / "manifest.json").read_text())
    rows = learning_fresh.read_fresh(fresh)
    assert len(rows) == len(manifest["tasks"]) == 4
    assert all(row["id"].startswith("synth1_") for row in rows)
    training = learning_fresh.load_splits(train / "synth")
    combinations = {row["combination"] for row in training}
    train_ops = {
        op for row in training if row["split"] == "train" for op in row["combination"].split(">")
    }
    for row in rows:
        assert row["combination"] not in combinations
        assert set(row["combination"].split(">")) <= train_ops
        assert (
            sum(
                op
                not in (
                    "sum",
                    "mean",
                    "amax",
                    "softmax",
                    "log_softmax",
                    "layer_norm",
                    "rms_norm",
                    "l2_normalize",
                )
                for op in row["combination"].split(">")
            )
            >= 3
        )
    assert manifest["drawn"] >= manifest["pool"] >= 4
    assert "duplicate of a training-synthesis task" in manifest["removed"]
    # the manifest guards the split: an edited task is refused wherever it is used
    table = list(datasets.Dataset.from_parquet(str(fresh / "data.parquet")))
    table[0]["source"] += "\n# edited\n"
    edited = fresh.parent / "edited"
    edited.mkdir()
    (edited / "manifest.json").write_text((fresh / "manifest.json").read_text())
    datasets.Dataset.from_list(table).to_parquet(str(edited / "data.parquet"))
    with pytest.raises(SystemExit, match="differs from its manifest"):
        learning_fresh.read_fresh(edited)


def test_a_split_is_made_once_and_never_with_the_training_seed(made) -> None:
    train, fresh = made
    argv = ["--train-synth", str(train / "synth"), "--seed", "1"]
    with pytest.raises(SystemExit, match="already holds a fresh split"):
        learning_fresh.main([*argv, "--out", str(fresh)])
    with pytest.raises(SystemExit, match="training synthesis's own seed"):
        learning_fresh.synthesize(train / "synth", fresh.parent / "other", 0, 10, [])


def test_the_held_out_sweeps_take_the_fresh_split(made, tmp_path) -> None:
    train, fresh = made
    out = tmp_path / "bench"
    out.mkdir()
    (out / "stages.json").write_text(
        json.dumps({"synth": {"heldout_tasks": ["old"], "validation_tasks": []}})
    )
    args = learning.build_parser().parse_args(["--out", str(out), "--heldout-from", str(fresh)])
    bench = learning.Benchmark(args)
    bench.synth()
    ids = sorted(row["id"] for row in learning_fresh.read_fresh(fresh))
    assert sorted(p.stem for p in (out / "tasks" / "heldout").glob("*.py")) == ids
    record = learning.Benchmark(args).stages["synth"]
    assert record["heldout_tasks"] == ids and record["heldout_tasks_of_synthesis"] == ["old"]
    assert bench.split_of()(ids[0]) == "heldout_fresh" and bench.split_of()("old") == "train"
    # the split travels with the run folder: its manifest, and the operators the report reads
    assert learning_fresh.read_fresh(out / "fresh_heldout") == learning_fresh.read_fresh(fresh)
    assert set(bench.operators()) >= set(ids)
