"""Benchmarks for sweeps: KernelBench (checkout or HF dataset), the bundled suite, any folder.

Task ids are what reports and the results store key on, so they must be unique within a sweep:
KernelBench problems are named ``level<L>/<file stem>`` (problem numbers restart at 1 in every
level), bundled and folder tasks keep their file stem.

Categories: a task that declares none (KernelBench problems never do) gets the one its
operators imply, read from its source's AST by ``kernelrl.data.curate.operators`` (the same
inference curation uses), so per-category tables cover KernelBench too. That makes ``eval``
import a sibling (``data``); the inference belongs at task loading (``env/task.py``) and moves
there once the owner of that file agrees.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kernelrl.env.task import Task, TaskError, load_task_folder, task_from_row

KERNELBENCH_HF_ID = "ScalingIntelligence/KernelBench"
_LEVEL_DIR = re.compile(r"^level(\d+)$")
_LEVEL_SPLIT = re.compile(r"^level_?(\d+)$")


def problem_id(task: Task) -> int | None:
    """The leading number of a task id's last part: ``level1/12_Matmul_`` -> 12."""
    match = re.match(r"(\d+)", task.id.rsplit("/", 1)[-1])
    return int(match.group(1)) if match else None


def kernelbench_levels_folder(root: str | Path) -> Path:
    """The folder of a KernelBench checkout's ``level<N>/`` folders: ``root`` may be the
    repository or its ``KernelBench/`` folder, as people point at either."""
    root = Path(root)
    return root / "KernelBench" if (root / "KernelBench").is_dir() else root


def load_kernelbench_folder(root: str | Path, backend: str = "triton") -> list[Task]:
    """A KernelBench checkout: ``<root>/KernelBench/level1/1_Square_matrix_multiplication_.py``
    (``root``: see ``kernelbench_levels_folder``)."""
    base = kernelbench_levels_folder(root)
    levels = sorted(
        (int(m.group(1)), d)
        for d in (base.iterdir() if base.is_dir() else [])
        if d.is_dir() and (m := _LEVEL_DIR.match(d.name))
    )
    if not levels:
        raise TaskError(f"{root} is not a KernelBench checkout: no level<N>/ folders found")
    tasks: list[Task] = []
    for level, folder in levels:
        for task in load_task_folder(folder, backend):
            tasks.append(dataclasses.replace(task, id=f"level{level}/{task.id}", level=level))
    return tasks


def _record_task(row: Mapping[str, Any], backend: str, level: int | None) -> Task:
    """One KernelBench dataset row (fields code, level, name, problem_id), with the id its
    checkout gives the same problem (``level<N>/<problem_id>_<name>``)."""
    if "code" not in row:
        raise TaskError(f"dataset row has no 'code' field (fields: {sorted(row)})")
    level = row.get("level", level)
    level = int(level) if level is not None else None
    name = str(row.get("name") or "")
    pid = row.get("problem_id")
    if pid is not None and not re.match(rf"0*{int(pid)}_", name):
        name = f"{int(pid)}_{name}" if name else str(pid)
    if not name:
        raise TaskError("dataset row has neither 'name' nor 'problem_id'")
    task_id = f"level{level}/{name}" if level is not None else name
    return task_from_row({"code": row["code"], "name": task_id, "level": level}, backend)


def tasks_from_rows(
    rows: Iterable[Mapping[str, Any]], backend: str = "triton", level: int | None = None
) -> list[Task]:
    return [_record_task(row, backend, level) for row in rows]


def load_kernelbench_dataset(
    name_or_path: str, backend: str = "triton", levels: Iterable[int] = ()
) -> list[Task]:
    """KernelBench's HF dataset layout: splits ``level_1`` .. ``level_4`` of rows with code,
    level, name, problem_id. ``name_or_path`` is a hub id (needs the hub), a folder written by
    ``save_to_disk``, or a JSON/JSONL/Parquet file (one split; rows carry their level)."""
    import datasets

    wanted = set(levels)
    path = Path(name_or_path)
    if path.is_file():
        kind = "parquet" if path.suffix == ".parquet" else "json"
        data: Any = datasets.load_dataset(kind, data_files=str(path))
    elif path.is_dir():
        data = datasets.load_from_disk(str(path))
    else:
        try:
            data = datasets.load_dataset(name_or_path)
        except Exception as exc:  # hub unreachable, unknown id: one clear line for the user
            raise TaskError(
                f"cannot load dataset {name_or_path!r} ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}); offline, point benchmark_path "
                "at a KernelBench checkout or a local copy of the dataset"
            ) from exc
    splits = data.items() if isinstance(data, datasets.DatasetDict) else [("train", data)]
    tasks: list[Task] = []
    for split_name, split in sorted(splits, key=lambda item: _split_order(item[0])):
        match = _LEVEL_SPLIT.match(split_name)
        split_level = int(match.group(1)) if match else None
        if wanted and split_level is not None and split_level not in wanted:
            continue
        tasks.extend(tasks_from_rows(split, backend, split_level))
    if wanted:  # a single split holds every level; rows carry theirs
        tasks = [t for t in tasks if t.level in wanted]
    tasks.sort(key=lambda t: (t.level or 0, problem_id(t) or 0, t.id))
    return tasks


def _split_order(name: str) -> tuple[int, str]:
    match = _LEVEL_SPLIT.match(name)
    return (int(match.group(1)) if match else 0, name)


UNCATEGORIZED = ("", "uncategorized")


def with_category(task: Task) -> Task:
    """The task with its declared category, or else the one inferred from its operators."""
    if task.category not in UNCATEGORIZED:
        return task
    from kernelrl.data.curate.operators import infer_category, task_ops

    return dataclasses.replace(task, category=infer_category(task_ops(task.source)))


def parse_id_ranges(spec: str) -> set[int]:
    """``'1-3,7'`` -> {1, 2, 3, 7}."""
    ids: set[int] = set()
    for part in filter(None, (p.strip() for p in spec.split(","))):
        match = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", part)
        if not match:
            raise ValueError(f"problem_ids: cannot read {part!r} (use e.g. '1-10,15')")
        low = int(match.group(1))
        high = int(match.group(2) or low)
        if high < low:
            raise ValueError(f"problem_ids: empty range {part!r}")
        ids.update(range(low, high + 1))
    return ids


def select_tasks(
    tasks: list[Task],
    levels: Iterable[int] = (),
    problem_ids: str = "",
    task_regex: str = "",
    max_tasks: int = 0,
) -> list[Task]:
    """Keep tasks of the given levels, problem ids and id regex, then the first ``max_tasks``."""
    levels = set(levels)
    ids = parse_id_ranges(problem_ids) if problem_ids else set()
    try:
        pattern = re.compile(task_regex) if task_regex else None
    except re.error as exc:
        raise ValueError(f"task_regex {task_regex!r}: {exc}") from exc
    kept = [
        t
        for t in tasks
        if (not levels or t.level in levels)
        and (not ids or problem_id(t) in ids)
        and (pattern is None or pattern.search(t.id))
    ]
    return kept[:max_tasks] if max_tasks > 0 else kept


def load_benchmark(
    benchmark: str,
    path: str = "",
    backend: str = "triton",
    levels: Iterable[int] = (),
    problem_ids: str = "",
    task_regex: str = "",
    max_tasks: int = 0,
) -> list[Task]:
    """The selected tasks of one benchmark; raises TaskError when nothing is left.

    ``bundled`` is kernelrl's own suite: ``kernelrl.data`` owns where it lives, so the caller
    (``kernelrl.launch``) passes its folder as ``path``.
    """
    levels = list(levels)
    if benchmark in ("bundled", "folder"):
        if not path:
            raise TaskError(f"benchmark {benchmark!r} needs the path of its task folder")
        tasks = load_task_folder(path, backend)
    elif benchmark == "kernelbench":
        tasks = load_kernelbench_folder(path, backend)
    elif benchmark == "hf":
        tasks = load_kernelbench_dataset(path or KERNELBENCH_HF_ID, backend, levels)
    else:
        raise ValueError(f"unknown benchmark {benchmark!r}")
    selected = select_tasks(tasks, levels, problem_ids, task_regex, max_tasks)
    if not selected:
        raise TaskError(f"no task of benchmark {benchmark!r} matches the selection")
    ids = [t.id for t in selected]
    if len(set(ids)) != len(ids):
        raise TaskError("task ids are not unique within the selection")
    return [with_category(t) for t in selected]
