"""The layers of docs/design.md: every import of the package points down (or along the one
documented sideways arrow), checked on the source of every module."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: layer -> what it may import from kernelrl (docs/design.md, "Layers"); None: anything.
ALLOWED: dict[str, set[str] | None] = {
    "progress": set(),
    "env": {"progress", "kernelrl"},  # the package itself: kernelrl.__version__
    "prompts": {"env"},
    "rewards": {"env"},
    "rl": {"env", "rewards", "prompts", "progress"},
    "data": {"env", "prompts", "progress"},
    "eval": {"env", "prompts", "progress", "data.curate.operators"},
    "launch": None,
}


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name == "kernelrl" or name.startswith("kernelrl.")}


def test_imports_point_down() -> None:
    wrong = []
    for layer, allowed in ALLOWED.items():
        files = [ROOT / f"{layer}.py"] if (ROOT / f"{layer}.py").exists() else []
        files += sorted((ROOT / layer).rglob("*.py")) if (ROOT / layer).is_dir() else []
        assert files, layer
        for path in files:
            for name in imports(path):
                target = name.removeprefix("kernelrl.")
                if allowed is None or target.split(".")[0] == layer:
                    continue
                if not any(target == a or target.startswith(a + ".") for a in allowed):
                    wrong.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not wrong, "\n".join(wrong)


def test_trusted_code_parses_python_through_the_one_lock() -> None:
    """Worker threads parse solutions at the same time; on CPython 3.11 that needs the lock in
    ``env/python_syntax.py`` (see there), so no other module calls ``ast.parse`` (or
    ``inspect.getsource``, which parses) itself."""
    direct = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in ("env", "data", "rewards", "rl", "eval", "launch")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path != ROOT / "env" / "python_syntax.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "ast.parse(" in line or "inspect.getsource(" in line
    ]
    assert direct == []


def module_files() -> dict[str, Path]:
    """Every module of the package by its dotted name (``kernelrl.env.task``)."""
    found = {"kernelrl": ROOT / "__init__.py"}
    for folder in ALLOWED:
        if (ROOT / f"{folder}.py").exists():
            found[f"kernelrl.{folder}"] = ROOT / f"{folder}.py"
        for path in sorted((ROOT / folder).rglob("*.py")) if (ROOT / folder).is_dir() else []:
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(("kernelrl", *parts))] = path
    return found


def file_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules ``path`` imports anywhere in it (top level, functions and
    ``TYPE_CHECKING`` blocks alike: a cycle of type hints is a cycle of design too); ``from
    package import name`` counts as importing ``package.name`` where that is a module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            found.update(name for name in names if name in modules)
            if not all(name in modules for name in names):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name in modules}


def test_no_import_cycle_between_files() -> None:
    """The layer rule checks folders; within a folder, files may still import each other in a
    circle, which makes the import order matter and the parts impossible to read apart."""
    modules = module_files()
    graph = {name: file_imports(path, modules) - {name} for name, path in modules.items()}
    # A package's __init__ re-exports its modules: the edges out of it are not the modules'.
    graph = {
        name: {t for t in targets if not name.startswith(t + ".")}
        for name, targets in graph.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for name in graph:
        if name not in index:
            visit(name)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)
