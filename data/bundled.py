"""The task suite we ship: ``data/tasks/*.py`` with our own solutions in ``data/solutions/``."""

from __future__ import annotations

from pathlib import Path

from kernelrl.env.task import Task, load_task_folder

DATA_DIR = Path(__file__).resolve().parent
TASKS_DIR = DATA_DIR / "tasks"
SOLUTIONS_DIR = DATA_DIR / "solutions"


def bundled_tasks(backend: str = "triton") -> list[Task]:
    return load_task_folder(TASKS_DIR, backend)


def bundled_solution_path(task_id: str, backend: str = "triton") -> Path:
    return SOLUTIONS_DIR / backend / f"{task_id}.py"


def bundled_pairs(backend: str = "triton") -> list[tuple[Task, str]]:
    """(task, solution source) for every bundled task that has a solution for ``backend``."""
    pairs = []
    for task in bundled_tasks(backend):
        path = bundled_solution_path(task.id, backend)
        if path.exists():
            pairs.append((task, path.read_text()))
    return pairs
