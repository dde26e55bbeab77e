"""The task format: loading from a file, a folder, and an HF datasets record; bad tasks."""

from __future__ import annotations

from pathlib import Path

import datasets
import pytest

from kernelrl.data.bundled import TASKS_DIR, bundled_pairs, bundled_tasks
from kernelrl.env.task import (
    TaskError,
    load_task,
    load_task_folder,
    task_from_record,
    tasks_from_dataset,
)

CATEGORIES = {
    "elementwise",
    "reduction",
    "normalization",
    "softmax",
    "matmul",
    "convolution",
    "loss",
    "fused",
}


def test_bundled_suite_covers_every_category_with_solutions() -> None:
    tasks = bundled_tasks()
    assert len(tasks) >= 24
    assert {t.category for t in tasks} == CATEGORIES
    assert len(bundled_pairs("triton")) == len(tasks)
    for task in tasks:
        assert task.size_overrides("cpu"), f"{task.id} has no cpu size variant"


def test_load_task_reads_metadata_without_running_it(tmp_path: Path) -> None:
    source = (TASKS_DIR / "01_relu.py").read_text() + "\nraise SystemExit('executed')\n"
    path = tmp_path / "level2" / "5_relu.py"
    path.parent.mkdir()
    path.write_text(source)
    task = load_task(path)
    assert (task.id, task.category, task.level) == ("5_relu", "elementwise", 2)
    assert task.size_overrides("cpu") == {"batch_size": 16, "dim": 256}
    assert task.tolerances("float16") == (1e-2, 1e-2)


def test_folder_loads_in_natural_order(tmp_path: Path) -> None:
    source = (TASKS_DIR / "01_relu.py").read_text()
    for name in ("10_b.py", "2_a.py", "1_c.py"):
        (tmp_path / name).write_text(source)
    assert [t.id for t in load_task_folder(tmp_path)] == ["1_c", "2_a", "10_b"]


def test_dataset_record_kernelbench_fields() -> None:
    source = (TASKS_DIR / "01_relu.py").read_text()
    dataset = datasets.Dataset.from_list([{"code": source, "name": "19_ReLU", "level": 1}])
    (task,) = tasks_from_dataset(dataset)
    assert (task.id, task.level, task.source) == ("19_ReLU", 1, source)
    with pytest.raises(TaskError, match="no field 'code'"):
        task_from_record({"text": source})


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def broken(:\n", "does not parse"),
        ("import torch\nclass Model: pass\n", "missing get_init_inputs, get_inputs"),
        ((TASKS_DIR / "01_relu.py").read_text() + "\nKERNELRL = make()\n", "dict literal"),
        (
            (TASKS_DIR / "01_relu.py").read_text() + "\nKERNELRL = {'colour': 1}\n",
            "unknown KERNELRL keys",
        ),
    ],
)
def test_bad_tasks_get_clear_errors(tmp_path: Path, source: str, message: str) -> None:
    path = tmp_path / "bad.py"
    path.write_text(source)
    with pytest.raises(TaskError, match=message):
        load_task(path)


def test_missing_file_and_folder() -> None:
    with pytest.raises(TaskError, match="cannot read task"):
        load_task("/nonexistent/task.py")
    with pytest.raises(TaskError, match="does not exist"):
        load_task_folder("/nonexistent")
