"""Curation keeps its work when interrupted, and talks on stderr like ``kernelrl eval``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from curate_smoke_run import run_cli

from kernelrl.data.curate import reference_probe, resume
from kernelrl.data.curate.config import CurateConfig, curate_config
from kernelrl.data.curate.pipeline import CurationInterrupted, run_curation
from kernelrl.data.loaders import load_curated

RAW = Path(__file__).parents[1] / "fixtures" / "curate" / "raw_tasks"
TASKS = ("01_gelu_tanh.py", "02_softmax_rows.py", "03_mlp_block.py")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    for name in TASKS:
        shutil.copy(RAW / name, folder / name)
    return folder


def stable(tasks) -> list[dict]:
    """Rows without what a measurement changes from run to run (timings)."""
    rows = []
    for row in tasks:
        row = {k: v for k, v in row.items() if k not in ("ref_runtime_ms", "runtime_bucket")}
        validation = json.loads(row["validation"] or "{}")
        validation.pop("phase_seconds", None)
        validation.pop("max_abs_diff_between_runs", None)
        rows.append({**row, "validation": validation})
    return rows


def config(corpus: Path, out: Path) -> CurateConfig:
    return curate_config(
        output_dir=str(out),
        task_sources=[f"kernelbench:{corpus}"],
        steps=["normalize", "dedup", "validate", "difficulty"],
        env_device="cpu",
        validate_workers=2,
        max_ref_runtime_ms=1000,
    )


def test_interrupted_validation_resumes_with_only_the_rest(corpus, tmp_path, monkeypatch) -> None:
    runs: list[str] = []
    original_run = reference_probe.ReferenceProber.run

    def counting_run(self, task, *args, **kwargs):
        runs.append(task.id)
        return original_run(self, task, *args, **kwargs)

    monkeypatch.setattr(reference_probe.ReferenceProber, "run", counting_run)
    whole = run_curation(config(corpus, tmp_path / "whole"))
    assert len(runs) == 2 * len(TASKS)

    # Ctrl-C right after the first validated record reached the journal.
    original_add = resume.Journal.add

    def add_then_interrupt(self, *args, **kwargs):
        original_add(self, *args, **kwargs)
        raise KeyboardInterrupt

    out = tmp_path / "interrupted"
    monkeypatch.setattr(resume.Journal, "add", add_then_interrupt)
    with pytest.raises(CurationInterrupted) as caught:
        run_curation(config(corpus, out))
    message = str(caught.value)
    assert "interrupted during validate" in message and "kept normalize, dedup" in message
    assert "1 finished records of validate" in message and "rerun the same command" in message
    assert not (out / "tasks").exists()
    journal = out / resume.STATE_DIR / "journals" / "validate.jsonl"
    assert len(journal.read_text().splitlines()) == 1

    monkeypatch.setattr(resume.Journal, "add", original_add)
    runs.clear()
    resumed = run_curation(config(corpus, out))
    assert len(runs) == 2 * (len(TASKS) - 1)  # the journaled task is not run again
    assert len(journal.read_text().splitlines()) == len(TASKS)
    assert len(whole.tasks) > 0 and stable(resumed.tasks) == stable(whole.tasks)
    assert stable(load_curated(str(out), "tasks")) == stable(whole.tasks)
    assert (out / "removed.jsonl").read_text() == (tmp_path / "whole" / "removed.jsonl").read_text()
    # the journaled task's measurements are the interrupted run's, not new ones
    first = json.loads(journal.read_text().splitlines()[0])
    row = next(r for r in resumed.tasks if r["id"] == first["id"])
    assert row["ref_runtime_ms"] == first["result"]["fields"]["ref_runtime_ms"]
    assert [r.step for r in resumed.reports] == ["normalize", "dedup", "validate", "difficulty"]

    # A third run finds every step finished: nothing runs, the same dataset comes out.
    runs.clear()
    again = run_curation(config(corpus, out))
    assert runs == [] and again.tasks.to_list() == resumed.tasks.to_list()


def test_cli_writes_tables_to_stderr_and_nothing_to_stdout(corpus, tmp_path) -> None:
    out = tmp_path / "cli"
    args = ("curate", "--output_dir", str(out), "--task_sources", f"kernelbench:{corpus}")
    process = run_cli(*args, "--steps", "normalize", "dedup")
    assert process.returncode == 0, process.stderr[-2000:]
    assert process.stdout == ""
    assert "step: dedup" in process.stderr and "dataset card:" in process.stderr
    assert (out / "dedup.md").exists() and "3 records in, 3 kept" in (out / "dedup.md").read_text()
    again = run_cli(*args, "--steps", "normalize", "dedup")
    assert again.returncode == 0 and again.stdout == ""
    assert "dedup: finished in an earlier run, loaded its checkpoint" in again.stderr
