"""Name resolution over a solution's AST: what an expression refers to, however it is spelled.

Imports, assignments (``f = torch.nansum``), default arguments, ``getattr`` with a constant-folded
name, ``importlib``/``__import__`` and ``functools.partial`` all resolve to a qualified name
(``torch.nansum``), so that a rule about ``torch.nansum`` holds for every alias of it. Also the
small AST helpers the checks share.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from kernelrl.env.parse import import_aliases

# The longest string the checks fold. Folding runs on the trusted side over source a model
# wrote: ``"{:>400000000}".format(x)`` or a chain of doublings would otherwise make the worker
# build gigabytes. No name the checks look for is anywhere near this long.
MAX_FOLDED_CHARS = 4096
_FORMAT_WIDTH = re.compile(r"\d{5,}")


def const_str(node: ast.AST | None, strings: dict[str, str] | None = None) -> str | None:
    """The value of a string expression built from constants (``"nan" + "sum"``, f-strings of
    constants, ``"".join([...])``, slicing, case and replace), else ``None``; ``None`` too for
    anything longer than ``MAX_FOLDED_CHARS``, decided before it is built."""
    text = _folded(node, strings or {})
    return text if text is None or len(text) <= MAX_FOLDED_CHARS else None


def _folded(node: ast.AST | None, strings: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return strings.get(node.id)
    if isinstance(node, ast.BinOp):
        left, right = const_str(node.left, strings), const_str(node.right, strings)
        if isinstance(node.op, ast.Add) and left is not None and right is not None:
            return left + right
        if isinstance(node.op, ast.Mult) and isinstance(node.right, ast.Constant):
            times = node.right.value
            if left is None or not isinstance(times, int) or len(left) * times > MAX_FOLDED_CHARS:
                return None
            return left * times
        return None
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            inner = value.value if isinstance(value, ast.FormattedValue) else value
            text = const_str(inner, strings)
            if text is None:
                return None
            parts.append(text)
        return "".join(parts)
    if isinstance(node, ast.Subscript):
        base = const_str(node.value, strings)
        try:
            index = ast.literal_eval(node.slice)
        except ValueError:
            if isinstance(node.slice, ast.Slice):
                bounds = [
                    ast.literal_eval(b) if b is not None else None
                    for b in (node.slice.lower, node.slice.upper, node.slice.step)
                ]
                return base[slice(*bounds)] if base is not None else None
            return None
        return base[index] if base is not None and isinstance(index, int) else None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        base = const_str(node.func.value, strings)
        if base is None:
            return None
        args = [const_str(a, strings) for a in node.args]
        if node.func.attr == "join" and len(node.args) == 1:
            seq = node.args[0]
            if isinstance(seq, ast.List | ast.Tuple):
                items = [const_str(e, strings) for e in seq.elts]
                return base.join(items) if None not in items else None  # type: ignore[arg-type]
            return None
        if None in args:
            return None
        if node.func.attr == "format" and _FORMAT_WIDTH.search(base):
            return None  # a width or precision that large only builds a huge string
        if node.func.attr == "replace" and len(args) >= 2:
            grows = base.count(args[0]) * max(len(args[1]) - len(args[0]), 0) if args[0] else 0
            if len(base) + grows > MAX_FOLDED_CHARS:
                return None
        if node.func.attr in ("lower", "upper", "strip", "lstrip", "rstrip", "replace", "format"):
            try:
                return getattr(base, node.func.attr)(*args)
            except (ValueError, IndexError, KeyError, TypeError):
                return None  # not a constant the checks can read, like any other
    return None


class Names:
    """Resolves expressions to qualified names: imports, assignments, default arguments,
    ``getattr`` with a foldable name, ``importlib.import_module``/``__import__`` and
    ``functools.partial``. Resolution is flow-insensitive: a name bound anywhere to a module
    attribute is that attribute everywhere (over-approximating is the safe side)."""

    def __init__(self, tree: ast.Module) -> None:
        self.imports = import_aliases(tree)
        self.aliases = dict(self.imports)
        self.self_aliases: dict[str, str] = {}
        self.strings = self._module_strings(tree)
        for _ in range(4):  # chains of aliases converge in a few passes
            for target, value in bindings(tree):
                resolved = self.resolve(value)
                if resolved is None:
                    continue
                if isinstance(target, ast.Name) and target.id not in self.imports:
                    self.aliases[target.id] = resolved
                elif is_self_attribute(target):
                    self.self_aliases[target.attr] = resolved  # type: ignore[union-attr]

    @staticmethod
    def _module_strings(tree: ast.Module) -> dict[str, str]:
        counts: dict[str, int] = {}
        values: dict[str, ast.AST] = {}
        for target, value in bindings(tree):
            if isinstance(target, ast.Name):
                counts[target.id] = counts.get(target.id, 0) + 1
                values[target.id] = value
        strings: dict[str, str] = {}
        for _ in range(3):
            for name, value in values.items():
                text = const_str(value, strings)
                if counts[name] == 1 and text is not None:
                    strings[name] = text
        return strings

    def resolve(self, node: ast.AST | None) -> str | None:
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            if is_self_attribute(node) and node.attr in self.self_aliases:
                return self.self_aliases[node.attr]
            base = self.resolve(node.value)
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) and func.id not in self.aliases else None
            qualified = self.resolve(func)
            if name == "getattr" and len(node.args) >= 2:
                base, attr = self.resolve(node.args[0]), self.const(node.args[1])
                return f"{base}.{attr}" if base and attr else None
            if (name == "__import__" or qualified == "importlib.import_module") and node.args:
                return self.const(node.args[0])
            if qualified in ("functools.partial", "functools.partialmethod") and node.args:
                return self.resolve(node.args[0])
        return None

    def const(self, node: ast.AST | None) -> str | None:
        return const_str(node, self.strings)


def bindings(tree: ast.AST) -> Iterator[tuple[ast.AST, ast.AST]]:
    """(target, value) for assignments, walrus, default arguments and ``for`` over a literal."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                yield from _pairs(target, node.value)
        elif isinstance(node, ast.AnnAssign | ast.NamedExpr) and node.value is not None:
            yield node.target, node.value
        elif isinstance(node, ast.For) and isinstance(node.iter, ast.List | ast.Tuple):
            for element in node.iter.elts:
                yield node.target, element
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            arguments = node.args
            positional = arguments.posonlyargs + arguments.args
            for arg, default in zip(positional[::-1], arguments.defaults[::-1], strict=False):
                yield ast.Name(id=arg.arg, ctx=ast.Store()), default
            for arg, default in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True):
                if default is not None:
                    yield ast.Name(id=arg.arg, ctx=ast.Store()), default


def _pairs(target: ast.AST, value: ast.AST) -> Iterator[tuple[ast.AST, ast.AST]]:
    if isinstance(target, ast.Tuple | ast.List) and isinstance(value, ast.Tuple | ast.List):
        if len(target.elts) == len(value.elts):
            for t, v in zip(target.elts, value.elts, strict=True):
                yield from _pairs(t, v)
        return
    yield target, value


def walk_skipping(root: ast.AST, skip: set[ast.FunctionDef]) -> Iterator[ast.AST]:
    """``ast.walk`` that does not descend into kernel definitions (device code)."""
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(child for child in ast.iter_child_nodes(node) if child not in skip)


def is_self_attribute(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def holder_key(target: ast.AST) -> str | None:
    while isinstance(target, ast.Subscript):
        target = target.value
    if isinstance(target, ast.Name):
        return target.id
    if is_self_attribute(target):
        return "self." + target.attr  # type: ignore[union-attr]
    return None


def root_name(node: ast.AST) -> ast.Name | None:
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node if isinstance(node, ast.Name) else None


def module_of(name: str | None) -> str:
    return name.lstrip(".").split(".")[0] if name else ""


def parent_map(root: ast.AST) -> dict[int, ast.AST]:
    return {id(child): node for node in ast.walk(root) for child in ast.iter_child_nodes(node)}


def flatten_targets(targets: list[ast.AST]) -> Iterator[ast.AST]:
    for target in targets:
        if isinstance(target, ast.Tuple | ast.List):
            yield from flatten_targets(list(target.elts))
        elif isinstance(target, ast.Starred):
            yield from flatten_targets([target.value])
        else:
            yield target
