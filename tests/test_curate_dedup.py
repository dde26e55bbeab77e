"""Dedup (normalised tokens + MinHash LSH) and decontamination (weighted n-gram overlap)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kernelrl.data.bundled import TASKS_DIR
from kernelrl.data.curate.decontaminate import (
    Benchmark,
    DecontaminateConfig,
    decontaminate,
    write_decontamination_report,
)
from kernelrl.data.curate.dedup import DedupConfig, dedup
from kernelrl.data.curate.normalize import normalize_tasks
from kernelrl.data.curate.tokens import normalized_tokens
from kernelrl.data.loaders import load_tasks

DATA = Path(__file__).parent / "data" / "curate"
RAW = DATA / "raw_tasks"


@pytest.fixture(scope="module")
def raw_tasks():
    tasks, _ = normalize_tasks(load_tasks([f"kernelbench:{RAW}"]))
    return tasks


def test_renaming_comments_and_sizes_do_not_change_tokens() -> None:
    original = (RAW / "01_gelu_tanh.py").read_text()
    renamed = (RAW / "05_gelu_renamed.py").read_text()
    assert original != renamed
    assert normalized_tokens(original) == normalized_tokens(renamed)
    # the operator is kept: relu is not gelu
    assert normalized_tokens(
        original.replace('F.gelu(x, approximate="tanh")', "F.relu(x)")
    ) != normalized_tokens(original)
    # numbers inside forward are kept (dim=0 and dim=1 are different tasks), sizes are not
    softmax = (RAW / "02_softmax_rows.py").read_text()
    assert normalized_tokens(softmax.replace("dim=-1", "dim=0")) != normalized_tokens(softmax)
    assert normalized_tokens(softmax.replace("rows = 4096", "rows = 512")) == normalized_tokens(
        softmax
    )


def test_dedup_removes_renamed_copy_and_near_duplicate(raw_tasks) -> None:
    kept, report = dedup(raw_tasks, DedupConfig())
    removed = {r.id: r for r in report.removed}
    assert set(removed) == {"05_gelu_renamed", "09_mlp_block_variant"}
    assert removed["05_gelu_renamed"].reason == "exact_duplicate"
    assert removed["05_gelu_renamed"].data["duplicate_of"] == "01_gelu_tanh"
    near = removed["09_mlp_block_variant"]
    assert near.reason == "near_duplicate" and near.data["duplicate_of"] == "03_mlp_block"
    assert 0.8 <= near.data["similarity"] < 1.0
    assert (report.count_in, report.count_out) == (len(raw_tasks), len(raw_tasks) - 2)
    assert "01_gelu_tanh" in kept["id"] and "03_mlp_block" in kept["id"]


def test_dedup_keeps_every_distinct_bundled_task() -> None:
    """The 31 bundled tasks are all different computations: none may be called a duplicate."""
    tasks = load_tasks([f"kernelbench:{TASKS_DIR}"])
    kept, report = dedup(tasks, DedupConfig())
    assert report.removed == [] and len(kept) == len(tasks) == 31


def test_decontamination_removes_copied_task_and_reports_why(raw_tasks, tmp_path: Path) -> None:
    benchmark = Benchmark.from_sources([f"kernelbench:{DATA / 'benchmark'}"], DecontaminateConfig())
    kept, report = decontaminate(raw_tasks, benchmark)
    assert [r.id for r in report.removed] == ["08_rms_norm_channels"]
    removal = report.removed[0]
    assert (
        removal.reason == "contaminated"
        and removal.data["benchmark_id"] == "level1/36_channel_rms_scale"
    )
    assert removal.data["score"] == pytest.approx(1.0)
    assert "08_rms_norm_channels" not in kept["id"] and len(kept) == len(raw_tasks) - 1
    write_decontamination_report(report, tmp_path / "decontamination.md")
    text = (tmp_path / "decontamination.md").read_text()
    assert (
        "| 08_rms_norm_channels | level1/36_channel_rms_scale | 1.00 |" in text and "yes |" in text
    )


def test_decontamination_does_not_flag_different_tasks() -> None:
    """Each bundled task against the other 30 as the benchmark: no false contamination."""
    files = sorted(TASKS_DIR.glob("*.py"))
    sources = {f.stem: f.read_text() for f in files}
    config = DecontaminateConfig()
    worst = 0.0
    for task_id, source in sources.items():
        benchmark = Benchmark([(k, v) for k, v in sources.items() if k != task_id], config)
        match = benchmark.best_match(source)
        worst = max(worst, match["score"] if match else 0.0)
    assert worst < config.threshold
    # and the same benchmark catches a renamed copy
    benchmark = Benchmark(list(sources.items()), config)
    copy = re.sub(r"\bx\b", "logits", sources["14_softmax_rows"]).replace("batch_size", "n")
    assert copy != sources["14_softmax_rows"]
    assert benchmark.best_match(copy)["benchmark_id"] == "14_softmax_rows"
    assert benchmark.best_match(copy)["score"] >= config.threshold
