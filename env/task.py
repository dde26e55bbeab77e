"""The task format: KernelBench-style PyTorch references plus a little metadata.

A task is Python source defining ``class Model(nn.Module)``, ``get_inputs()`` and
``get_init_inputs()``. Optional metadata lives in a module-level ``KERNELRL = {...}`` dict
literal, read with ``ast.literal_eval`` so that loading a task never executes it:

- ``category``: what kind of computation it is (elementwise, matmul, ...);
- ``atol`` / ``rtol``: tolerances overriding the dtype-aware defaults;
- ``sizes``: ``{device_kind: {global_name: value}}`` overrides of module globals, so one task
  runs in seconds under the Triton interpreter on CPU and at a realistic size on a GPU. A task
  that declares no ``cpu`` sizes gets them derived (env/sizes.py) when its published sizes are
  too large for a CPU; ``"cpu": {}`` declares that the published sizes are fine as they are.

``get_init_inputs()`` may follow KernelBench (a list of positional constructor arguments) or
KernelBook (``[args, kwargs]``); :func:`init_args` tells the two apart.

``Task.trusted`` says whether the task's own code may run in the trusted worker (its reference,
its size derivation): true for the tasks the operator names (bundled tasks, KernelBench files,
datasets), false for a task a client sends, whose code runs only in the sandbox
(env/sandboxed_reference.py, docs/threat-model.md).
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelrl.env.backends import get_backend
from kernelrl.env.python_syntax import parse_python

# Default tolerances by output dtype (name as torch prints it without the "torch." prefix).
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (1e-4, 1e-4),
    "float64": (1e-7, 1e-7),
    "float16": (1e-2, 1e-2),
    "bfloat16": (2e-2, 2e-2),
}


class TaskError(ValueError):
    """A task that cannot be used: unreadable, not in the KernelBench format, bad metadata."""


class UntrustedTaskCode(Exception):
    """Code of the trusted side was asked to execute an untrusted task's code: a bug of ours.
    Neither a TaskError nor any error the evaluator turns into a verdict, so it can neither run
    the code nor be taken for the solution's failure or the task's."""


def require_trusted(task: Task, doing: str) -> None:
    """Refuse, before anything runs, to execute an untrusted task's code in this process."""
    if not task.trusted:
        raise UntrustedTaskCode(
            f"task {task.id} is untrusted: {doing} would run its code outside the sandbox"
        )


@dataclass(frozen=True)
class Task:
    """One KernelBench-format task. Immutable and cheap to send between processes."""

    id: str
    source: str
    backend: str = "triton"
    category: str = "uncategorized"
    atol: float | None = None
    rtol: float | None = None
    sizes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    level: int | None = None
    trusted: bool = True

    def __post_init__(self) -> None:
        try:
            get_backend(self.backend)
        except ValueError as exc:
            raise TaskError(f"task {self.id}: {exc}") from None

    @property
    def hash(self) -> str:
        """Content hash: reference timings, results, memory plans and derived sizes are keyed
        by it, not by the id.

        An untrusted task's hash is salted: its evaluations follow another procedure (its
        reference runs in the sandbox and times itself, its CPU sizes are never derived), so
        no cache may answer for it with what was measured for the trusted task of the same
        source, or the other way. A trusted task's hash is the plain content hash, as before.
        """
        salt = b"" if self.trusted else b"untrusted\0"
        return hashlib.sha256(salt + self.source.encode()).hexdigest()[:16]

    def size_overrides(self, device_kind: str) -> dict[str, Any]:
        """The module-global overrides the task declares for 'cpu' or 'cuda' (empty when it
        declares none). Reading them runs nothing; CPU sizes derived from the published ones
        are ``kernelrl.env.sizes.size_overrides``'s job, which runs the task."""
        return dict(self.sizes.get(device_kind, {}))

    def tolerances(self, dtype_name: str) -> tuple[float, float]:
        default_atol, default_rtol = DEFAULT_TOLERANCES.get(dtype_name, (1e-4, 1e-4))
        return (
            self.atol if self.atol is not None else default_atol,
            self.rtol if self.rtol is not None else default_rtol,
        )

    def with_backend(self, backend: str) -> Task:
        return Task(
            self.id,
            self.source,
            backend,
            self.category,
            self.atol,
            self.rtol,
            self.sizes,
            self.level,
            self.trusted,
        )


def init_args(init_inputs: Any) -> tuple[list[Any], dict[str, Any]]:
    """Constructor ``(args, kwargs)`` from what a task's ``get_init_inputs()`` returned.

    KernelBench returns the positional arguments (``[in_features, out_features]``); KernelBook,
    the PyTorch/Triton corpus behind KernelLLM, returns ``[args, kwargs]`` (``[[], {'dim': 4}]``).
    The KernelBook form is recognised by its shape alone: exactly two items, a list/tuple then
    a dict whose keys are all strings. Accepted ambiguity: a KernelBench task whose constructor
    takes exactly (a list or tuple, a str-keyed dict) positionally is read as KernelBook; no
    such task is known, and its author can pass ``[[the_list, the_dict], {}]`` to be explicit.
    """
    items = list(init_inputs)
    if (
        len(items) == 2
        and isinstance(items[0], list | tuple)
        and isinstance(items[1], dict)
        and all(isinstance(key, str) for key in items[1])
    ):
        return list(items[0]), dict(items[1])
    return items, {}


def _is_metadata(node: ast.stmt) -> bool:
    """Whether ``node`` is the module-level ``KERNELRL = ...`` statement."""
    return isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == "KERNELRL" for t in node.targets
    )


def strip_metadata(source: str) -> str:
    """``source`` without its ``KERNELRL = {...}`` literal and the comment lines right above it:
    evaluation metadata (CPU sizes, tolerances) is not part of the problem, neither for the model
    that is shown the task nor for curation comparing tasks. Every other line stays as it was
    (blank lines inside a string are part of the program); where the literal stood, the blank
    lines around it close up to one. A source that does not parse is returned unchanged."""
    try:
        tree = parse_python(source)
    except SyntaxError:
        return source
    lines = source.splitlines(keepends=True)
    for node in reversed([n for n in tree.body if _is_metadata(n)]):  # later lines first
        start, end = node.lineno - 1, node.end_lineno or node.lineno
        while start > 0 and lines[start - 1].lstrip().startswith("#"):
            start -= 1
        blank_before = start == 0 or not lines[start - 1].strip()
        while blank_before and end < len(lines) and not lines[end].strip():
            end += 1
        del lines[start:end]
    return "".join(lines)


def _read_metadata(source: str, origin: str) -> dict[str, Any]:
    """Validate the KernelBench contract on the AST and read the KERNELRL literal."""
    try:
        tree = parse_python(source)
    except SyntaxError as exc:
        raise TaskError(
            f"{origin}: task source does not parse: line {exc.lineno}: {exc.msg}"
        ) from exc
    defined = set()
    metadata: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            defined.add(node.name)
        elif _is_metadata(node):
            try:
                metadata = ast.literal_eval(node.value)
            except ValueError as exc:
                raise TaskError(f"{origin}: KERNELRL must be a dict literal: {exc}") from exc
            if not isinstance(metadata, dict):
                raise TaskError(f"{origin}: KERNELRL must be a dict literal")
    missing = {"Model", "get_inputs", "get_init_inputs"} - defined
    if missing:
        raise TaskError(f"{origin}: not a KernelBench task, missing {', '.join(sorted(missing))}")
    return metadata


def task_from_source(
    source: str,
    task_id: str,
    backend: str = "triton",
    level: int | None = None,
    trusted: bool = True,
) -> Task:
    """The Task of a source text, read without executing it. ``trusted=False`` for a task
    whose code must run only in the sandbox (a client's)."""
    meta = _read_metadata(source, task_id)
    unknown = set(meta) - {"category", "atol", "rtol", "sizes", "level"}
    if unknown:
        raise TaskError(f"{task_id}: unknown KERNELRL keys {sorted(unknown)}")
    return Task(
        id=task_id,
        source=source,
        backend=backend,
        category=str(meta.get("category", "uncategorized")),
        atol=meta.get("atol"),
        rtol=meta.get("rtol"),
        sizes=meta.get("sizes", {}),
        level=meta.get("level", level),
        trusted=trusted,
    )


def load_task(path: str | Path, backend: str = "triton") -> Task:
    path = Path(path)
    try:
        source = path.read_text()
    except OSError as exc:
        raise TaskError(f"cannot read task {path}: {exc.strerror or exc}") from exc
    level_match = re.search(r"level(\d+)", str(path.parent))
    return task_from_source(
        source, path.stem, backend, int(level_match.group(1)) if level_match else None
    )


def load_task_folder(folder: str | Path, backend: str = "triton") -> list[Task]:
    """Every ``*.py`` task of a folder (KernelBench level layout), in natural id order."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TaskError(f"task folder {folder} does not exist")
    files = sorted(folder.glob("*.py"), key=_natural_key)
    files = [f for f in files if not f.name.startswith("_")]
    if not files:
        raise TaskError(f"task folder {folder} holds no *.py task")
    return [load_task(f, backend) for f in files]


def task_from_row(row: Mapping[str, Any], backend: str | None = None, trusted: bool = True) -> Task:
    """The Task of one dataset row: every row-to-Task conversion in kernelrl goes through here
    (RL training, curation, evaluation sweeps on KernelBench's dataset).

    Two layouts, told apart by their source column:

    - kernelrl's task schema (``kernelrl.data.schema``, ``source``): ``id``, ``source`` and the
      optional ``backend``, ``category``, ``atol``, ``rtol``, ``sizes`` (JSON text or a mapping)
      and ``level``. The columns are the task's metadata and the source is not read again:
      curation wrote them from the source's ``KERNELRL`` literal with the record's own metadata
      winning, so a row can override what its source declares (size variants, tolerances).
    - KernelBench's dataset layout (``code``): ``code``, ``name``, ``level``. The source is read
      as a task file is (KernelBench contract checked, ``KERNELRL`` metadata); the id is the
      name, or ``task_<content hash>`` for a row without one.

    ``trusted``: whether the row's code may run in the trusted worker; the caller says so
    (the operator who names the dataset), never a column of the row itself.

    ``backend`` overrides the row's own (default ``triton``). A row of neither layout, or with
    unreadable ``sizes``, is a one-line TaskError. How a task's constructor arguments are read
    (KernelBench's positional list or KernelBook's ``[args, kwargs]``) is decided when it runs,
    by :func:`init_args`, the same for both layouts.
    """
    if "source" in row:
        if "id" not in row:
            raise TaskError(f"a task row needs an 'id' column besides 'source', got {sorted(row)}")
        sizes = row.get("sizes") or {}
        if isinstance(sizes, str):
            try:
                sizes = json.loads(sizes) or {}
            except json.JSONDecodeError as exc:
                raise TaskError(f"task row {row['id']}: 'sizes' is not JSON: {exc}") from exc
        return Task(
            id=str(row["id"]),
            source=row["source"],
            backend=backend or row.get("backend") or "triton",
            category=row.get("category") or "uncategorized",
            atol=row.get("atol"),
            rtol=row.get("rtol"),
            sizes=sizes,
            level=row.get("level"),
            trusted=trusted,
        )
    if "code" in row:
        source = str(row["code"])
        task_id = str(row.get("name") or f"task_{hashlib.sha256(source.encode()).hexdigest()[:8]}")
        level = row.get("level")
        return task_from_source(
            source,
            task_id,
            backend or row.get("backend") or "triton",
            int(level) if level is not None else None,
            trusted,
        )
    raise TaskError(
        "a task row needs 'id' and 'source' (kernelrl's task schema) or 'code' (KernelBench's "
        f"dataset layout), got {sorted(row)}"
    )


def _natural_key(path: Path) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]
