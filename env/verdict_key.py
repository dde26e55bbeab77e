"""What a stored verdict is keyed on: everything that decides it, and nothing else.

A results store that serves a verdict for a (task, solution) pair it was not made for hands out
rewards nobody earned: a solution 0.05 off, judged correct under a loose tolerance, would be
served as correct for the strict task; one judged with the static checks off, to a pool that
runs them. So the key covers the task as the evaluator reads it (its source and every field but
the ones that only name or file it), the solution, the device (kind and name), the library
versions, the evaluation settings (``EvalConfig`` as a whole, minus the fields that cannot change
a verdict, listed with why in ``NOT_VERDICT_SETTINGS``: a field added later is in the key until
someone shows it does not belong there), and a fingerprint of the environment's own code, so
that a changed checker never serves what the old one decided.

Kept free of torch: computing a key must not need the evaluator.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelrl.env.python_syntax import parse_python

#: Bumped whenever what the key covers changes: entries keyed another way are never hit.
KEY_VERSION = 2

#: ``EvalConfig`` fields that cannot change a verdict, and why. Everything else is in the key.
NOT_VERDICT_SETTINGS: dict[str, str] = {
    "device": "the device actually used is in the key (the pool's device kind and name); "
    "'auto' and 'cuda' name the same one",
    "spare_children": "how many sandboxes warm ahead; every evaluation runs in a fresh one "
    "either way, and pools raise it to fit their host",
    "admission_in_order": "which waiting evaluation the GPU memory goes to first; each is "
    "admitted with the same plan, and its timing still has the GPU to itself",
    "admission_backfill": "the same: which waiting evaluation starts first",
}

#: ``Task`` fields that only name or file a task: the evaluator never reads them.
NOT_VERDICT_TASK_FIELDS: dict[str, str] = {
    "id": "a name: results are keyed by content, a served result is renamed to the asker's id",
    "category": "a label for reports",
    "level": "a label for reports",
}


def _plain(value: Any) -> Any:
    """JSON-ready form of what tasks and configs hold (mappings, sequences, dataclasses)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)


def task_identity(task: Any) -> dict[str, Any]:
    """Every field of the task that the evaluation reads (source, backend, tolerances, sizes,
    and any field added later, such as whether the task is trusted), the source as its hash."""
    identity = {}
    for item in dataclasses.fields(task):
        if item.name in NOT_VERDICT_TASK_FIELDS:
            continue
        value = getattr(task, item.name)
        if item.name == "source":
            value = hashlib.sha256(value.encode()).hexdigest()
        identity[item.name] = _plain(value)
    return identity


def evaluation_settings(config: Any) -> dict[str, Any]:
    """The ``EvalConfig`` fields that can change a verdict: all but ``NOT_VERDICT_SETTINGS``."""
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise TypeError(f"evaluation settings come from an EvalConfig, got {type(config).__name__}")
    return {
        item.name: _plain(getattr(config, item.name))
        for item in dataclasses.fields(config)
        if item.name not in NOT_VERDICT_SETTINGS
    }


# ---------------------------------------------------------------------- the environment's code


def _module_file(root: Path, parts: list[str]) -> Path | None:
    """The file of module ``kernelrl.<parts>`` under the package root, if it is one of ours."""
    base = root.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imported_modules(path: Path, root: Path) -> set[tuple[str, ...]]:
    """Modules of the package that ``path`` imports (absolute or relative), as name parts
    below ``kernelrl``; ``from kernelrl.a import b`` names both ``a`` and ``a.b``."""
    try:
        tree = parse_python(path.read_text(), str(path))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return set()
    package = list(path.relative_to(root).parent.parts)
    found: set[tuple[str, ...]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "kernelrl":
                    found.add(tuple(parts[1:]))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1] if node.level > 1 else package
                parts = base + (node.module.split(".") if node.module else [])
            elif node.module and node.module.split(".")[0] == "kernelrl":
                parts = node.module.split(".")[1:]
            else:
                continue
            found.add(tuple(parts))
            found.update(tuple([*parts, alias.name]) for alias in node.names)
    return found


def environment_files(root: Path) -> list[Path]:
    """The files of the environment's code under the package root ``root``: every file of
    ``env/`` (compiled caches aside) and every module of the package it imports, transitively,
    with the ``__init__.py`` of each package on the way (importing a module runs them)."""
    files = {p for p in (root / "env").rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    files.add(root / "__init__.py")
    todo = sorted(p for p in files if p.suffix == ".py")
    while todo:
        for parts in _imported_modules(todo.pop(), root):
            for depth in range(len(parts) + 1):
                found = _module_file(root, list(parts[:depth]))
                if found is not None and found not in files:
                    files.add(found)
                    todo.append(found)
    return sorted(p for p in files if p.is_file())


def code_fingerprint(root: Path) -> str:
    """Hash of the environment's files (their paths below ``root`` and their bytes)."""
    digest = hashlib.sha256()
    for path in environment_files(root):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def package_root() -> Path:
    """The directory of the ``kernelrl`` package (the repository root)."""
    import kernelrl

    return Path(kernelrl.__file__).resolve().parent


@functools.cache
def environment_fingerprint() -> str:
    """``code_fingerprint`` of this process's kernelrl, computed once per process."""
    return code_fingerprint(package_root())


# ---------------------------------------------------------------------- the key


@dataclass(frozen=True)
class VerdictContext:
    """Where and how a pool judges: the part of the key that is not the task or the solution."""

    device: str
    device_name: str
    versions: Mapping[str, str]
    settings: Mapping[str, Any]
    code: str

    @classmethod
    def of(cls, pool: Any, config: Any) -> VerdictContext:
        """The context of ``pool``, which evaluates with ``config`` (its ``EvalConfig``)."""
        return cls(
            device=str(pool.device),
            device_name=str(pool.device_name),
            versions=dict(pool.versions),
            settings=evaluation_settings(config),
            code=environment_fingerprint(),
        )

    def material(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "device_name": self.device_name,
            "versions": _plain(self.versions),
            "settings": _plain(self.settings),
            "code": self.code,
        }


def verdict_key(task: Any, solution: str, context: VerdictContext) -> str:
    """The store's key of one verdict: SHA-256 over everything that decides it."""
    material = {
        "key_version": KEY_VERSION,
        "task": task_identity(task),
        "solution": hashlib.sha256(solution.encode()).hexdigest(),
        **context.material(),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()
