"""The layers of docs/design.md: every import of the package points down (or along the one
documented sideways arrow), checked on the source of every module; and the sizes every module
and function keeps (500 and 80 lines)."""

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


# ------------------------------------------------------------------------------ sizes
#: The folders whose modules are the package's own code (and the top-level modules beside
#: them). ``data/tasks`` and ``data/solutions`` are not code of ours but task files in
#: KernelBench's format (what a policy is asked to write, and reference answers to it).
SIZED_FOLDERS = ("env", "rewards", "rl", "data", "eval", "launch", "benchmarks")
NOT_OURS = (ROOT / "data" / "tasks", ROOT / "data" / "solutions")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
#: "path:qualified name" -> why it may be longer: only a function whose body IS a literal
#: table (``test_the_size_allow_lists_hold_only_literal_tables`` checks it), which splitting would only
#: scatter. None qualifies today.
LONG_FUNCTIONS: dict[str, str] = {}
#: path -> why it may be longer: only a module that is a data table (the same test checks that
#: its long part is literals). None qualifies today.
LONG_MODULES: dict[str, str] = {}


def sized_modules() -> list[Path]:
    """Every module of the package's own code, in a stable order."""
    files = sorted(ROOT.glob("*.py"))
    for folder in SIZED_FOLDERS:
        files += sorted((ROOT / folder).rglob("*.py"))
    return [path for path in files if not any(path.is_relative_to(p) for p in NOT_OURS)]


def functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, ast.AST]]:
    """(qualified name, node) of every function and method, nested ones too."""
    found = []
    for node in ast.iter_child_nodes(tree):
        name = f"{prefix}{getattr(node, 'name', '')}"
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.append((name, node))
            found += functions(node, name + ".")
        elif isinstance(node, ast.ClassDef):
            found += functions(node, name + ".")
        else:
            found += functions(node, prefix)
    return found


def span(node: ast.AST) -> int:
    """Lines from ``def`` (or the first decorator) to the function's last line."""
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    return node.end_lineno - first + 1


def is_literal_table(node: ast.AST) -> bool:
    """Whether a function's body is a docstring and one ``return`` (or assignment) of a
    literal container of literals: a table, not logic."""
    body = list(node.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    if len(body) != 1 or not isinstance(body[0], ast.Return | ast.Assign | ast.AnnAssign):
        return False
    value = body[0].value
    return is_literal_container(value)


def is_literal_container(value: ast.AST | None) -> bool:
    """A dict, list, tuple or set of constants (signed numbers too), nested or not."""
    literal = (ast.Constant, ast.Dict, ast.List, ast.Tuple, ast.Set, ast.expr_context)
    return isinstance(value, ast.Dict | ast.List | ast.Tuple | ast.Set) and all(
        isinstance(part, (*literal, ast.UnaryOp, ast.unaryop)) for part in ast.walk(value)
    )


def long_functions() -> dict[str, ast.AST]:
    found = {}
    for path in sized_modules():
        for name, node in functions(ast.parse(path.read_text())):
            if span(node) > MAX_FUNCTION_LINES:
                found[f"{path.relative_to(ROOT)}:{name}"] = node
    return found


def test_no_function_over_80_lines() -> None:
    """A function that does not fit a screen does several things; its steps get names."""
    found = long_functions()
    over = [
        f"{key} ({span(node)} lines)" for key, node in found.items() if key not in LONG_FUNCTIONS
    ]
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(over)


def test_no_module_over_500_lines() -> None:
    """A module over 500 lines holds several responsibilities; split along them."""
    over = [
        f"{path.relative_to(ROOT)} ({lines} lines)"
        for path in sized_modules()
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
        and str(path.relative_to(ROOT)) not in LONG_MODULES
    ]
    assert not over, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(over)


def test_the_size_allow_lists_hold_only_literal_tables() -> None:
    """An allowed function must still exist, be long and be a literal table; an allowed module
    must still be long and owe its length to such tables (or to top-level literal
    assignments): the allow-lists cannot become a way around the rule."""
    found = long_functions()
    for key in LONG_FUNCTIONS:
        assert key in found, f"{key} is allowed but no longer over the limit: remove it"
        assert is_literal_table(found[key]), f"{key} is allowed as a table but holds logic"
    for name in LONG_MODULES:
        lines = len((ROOT / name).read_text().splitlines())
        assert lines > MAX_MODULE_LINES, f"{name} is allowed but no longer over the limit"
        tree = ast.parse((ROOT / name).read_text())
        tables = sum(
            span(node)
            for node in tree.body
            if is_literal_table(node)
            or (isinstance(node, ast.Assign | ast.AnnAssign) and is_literal_container(node.value))
        )
        code = lines - tables
        assert code <= MAX_MODULE_LINES, f"{name} is allowed as a table but has {code} other lines"


def test_the_table_check_tells_a_table_from_logic() -> None:
    table = ast.parse('def f():\n    """Doc."""\n    return {"a": (1, -2), "b": [3.0, "x"]}\n')
    logic = ast.parse("def f(x):\n    return {'a': x + 1}\n")
    call = ast.parse("def f():\n    return [len('x')]\n")
    assert is_literal_table(table.body[0])
    assert not is_literal_table(logic.body[0])
    assert not is_literal_table(call.body[0])
    nested = ast.parse("class A:\n    def m(self):\n        def inner():\n            pass\n")
    assert [name for name, _ in functions(nested)] == ["A.m", "A.m.inner"]
    decorated = ast.parse("@property\ndef f():\n    pass\n")
    assert span(decorated.body[0]) == 3
    module_table = ast.parse("ROWS = [(1, 'a'), (2, 'b')]\nX = f()\n")
    assert is_literal_container(module_table.body[0].value)
    assert not is_literal_container(module_table.body[1].value)
