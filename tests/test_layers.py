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
