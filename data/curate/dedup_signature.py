"""What a KernelBench task computes, read from its AST: the signals deduplication compares.

KernelBench files share much of their text (the docstring template, imports, the class shell),
and the problem itself often lies in one token (``nn.Conv2d`` vs ``nn.Conv3d``, ``groups=``) or
in the sizes alone (tall-skinny vs square matmul). Text similarity therefore merges different
kernel problems. A task is described here by four signals instead, none of which reads
docstrings, comments, type annotations or the author's names:

- ``computation``: the canonical AST of everything but the input generators (``Model``, its
  helpers, module-level code): docstrings and annotations dropped, import aliases resolved
  (``F.gelu`` and ``Fn.gelu`` are ``torch.nn.functional.gelu``), local names, parameters and
  ``self`` attributes renamed by order of first appearance (``v0``, ``v1``, ``self.a0``) so
  that data flow is kept: ``return output`` and ``return h_n`` stay different;
- ``ops``: the operators in source order (torch calls, ``nn`` layers at their call sites,
  tensor methods, Python operators) without the layout ops that do no arithmetic;
- ``returns``: the canonical form of ``forward``'s return statements (which value is output);
- ``shapes``: ``get_inputs`` and ``get_init_inputs`` with the module-level constants they read
  replaced by their values, plus the values of constants the computation reads. Two tasks with
  the same computation and other shapes are *shape variants*.

Nothing is executed: constants are evaluated by a tiny evaluator over literals and arithmetic.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import copy
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from kernelrl.env.python_syntax import parse_python
from kernelrl.env.task import strip_metadata

CONTRACT = {"Model", "ModelNew", "forward", "__init__", "get_inputs", "get_init_inputs"}
INPUT_FUNCTIONS = ("get_inputs", "get_init_inputs")
BUILTINS = frozenset(dir(builtins)) | {"self", "cls"}
# Methods that move or reinterpret data without arithmetic: two tasks differing only in these
# are the same kernel problem (``x.contiguous()`` added by a copy-editor).
LAYOUT_OPS = frozenset(
    {
        "contiguous",
        "view",
        "reshape",
        "flatten",
        "squeeze",
        "unsqueeze",
        "clone",
        "detach",
        "to",
        "cpu",
        "cuda",
        "type",
    }
)
_TOKEN = re.compile(r"\w+|[^\s\w]")


@dataclass
class Signature:
    """The dedup signals of one task (see the module docstring)."""

    computation: str  # hash of the canonical computation AST
    structure: str  # the same with every number blanked: equal for size variants
    tokens: list[str]  # tokens of the canonical computation, for near-duplicate similarity
    ops: tuple[str, ...]
    returns: str
    shapes: str  # canonical input generators with constants substituted
    numbers: tuple[Any, ...]  # numeric literals of the computation, in order (sizes, dims, eps)
    flags: tuple[Any, ...]  # other literals of the computation (True, None, "mean")
    shapes_text: str = ""  # short human-readable form of ``shapes`` for reports
    parsed: bool = True
    notes: dict[str, Any] = field(default_factory=dict)


class _ConstEvaluator:
    """Values of module-level constants: literals, names of constants, + - * // / % **."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def value(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name) and node.id in self.values:
            return self.values[node.id]
        if isinstance(node, ast.Tuple | ast.List):
            return tuple(self.value(e) for e in node.elts)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            operand = self.value(node.operand)
            return -operand if isinstance(node.op, ast.USub) else +operand
        if isinstance(node, ast.BinOp):
            left, right = self.value(node.left), self.value(node.right)
            if not all(isinstance(v, int | float) for v in (left, right)):
                raise ValueError("not numeric")
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("too large")
            ops = {
                ast.Add: lambda a, b: a + b,
                ast.Sub: lambda a, b: a - b,
                ast.Mult: lambda a, b: a * b,
                ast.FloorDiv: lambda a, b: a // b,
                ast.Div: lambda a, b: a / b,
                ast.Mod: lambda a, b: a % b,
                ast.Pow: lambda a, b: a**b,
            }
            if type(node.op) in ops:
                return ops[type(node.op)](left, right)
        raise ValueError("not a constant")

    def read(self, tree: ast.Module) -> None:
        for node in tree.body:
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            for target in targets:
                if isinstance(target, ast.Name):
                    with contextlib.suppress(ValueError, ArithmeticError, TypeError):
                        self.values[target.id] = self.value(value)


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Import aliases to qualified names: ``F`` -> ``torch.nn.functional``."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    names[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _is_docstring(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


class _Canonical(ast.NodeTransformer):
    """Renames and strips a tree in place (see the module docstring)."""

    def __init__(self, aliases: dict[str, str], constants: dict[str, Any], inline: bool) -> None:
        self.aliases, self.constants, self.inline = aliases, constants, inline
        self.names: dict[str, str] = {}
        self.attributes: dict[str, str] = {}
        self.constants_read: list[Any] = []
        self.locals: list[set[str]] = []  # names bound in the enclosing functions

    def _name(self, name: str) -> str:
        if name in CONTRACT or name in BUILTINS or name.startswith("__"):
            return name
        return self.names.setdefault(name, f"v{len(self.names)}")

    def _body(self, body: list[ast.stmt]) -> list[ast.stmt]:
        kept = [self.visit(stmt) for stmt in body if not _is_docstring(stmt)]
        return [stmt for stmt in kept if stmt is not None] or [ast.Pass()]

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        bound = {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
        bound |= {
            n.id
            for n in ast.walk(node)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store | ast.Del)
        }
        node.name = self._name(node.name)
        node.returns, node.decorator_list = None, [self.visit(d) for d in node.decorator_list]
        node.args = self.visit(node.args)
        self.locals.append(bound)
        node.body = self._body(node.body)
        self.locals.pop()
        return node

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        node.name = self._name(node.name)
        node.bases = [self.visit(b) for b in node.bases]
        node.body = self._body(node.body)
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        return ast.arg(arg=self._name(node.arg), annotation=None)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST | None:
        if node.value is None:
            return None
        return self.visit(ast.Assign(targets=[node.target], value=node.value, lineno=0))

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in self.aliases:
            return ast.Name(id=self.aliases[node.id], ctx=node.ctx)
        local = any(node.id in scope for scope in self.locals)
        if node.id in self.constants and isinstance(node.ctx, ast.Load) and not local:
            self.constants_read.append(self.constants[node.id])
            if self.inline:
                return ast.Constant(value=self.constants[node.id])
        return ast.Name(id=self._name(node.id), ctx=node.ctx)

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            if not node.attr.startswith("__"):
                attr = self.attributes.setdefault(node.attr, f"a{len(self.attributes)}")
                return ast.Attribute(value=node.value, attr=attr, ctx=node.ctx)
            return node
        node.value = self.visit(node.value)
        return node


def _qualified(node: ast.expr) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


class _Ops(ast.NodeVisitor):
    """Operators in source order; ``self.aN(x)`` stands for the layer assigned to ``self.aN``."""

    def __init__(self) -> None:
        self.ops: list[str] = []
        self.layers: dict[str, str] = {}

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            name = _qualified(target)
            if name and name.startswith("self.") and isinstance(node.value, ast.Call):
                self.layers[name] = _qualified(node.value.func) or "call"
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)  # arguments first: they are computed before the call
        name = _qualified(node.func)
        if name is None:
            self.ops.append("call")
        elif name.startswith("self."):
            self.ops.append(self.layers.get(name, name) + "()")
        elif name.split(".")[0] in ("torch", "math", "triton"):
            self.ops.append(name)
        elif "." in name:
            method = name.rsplit(".", 1)[1]
            if method not in LAYOUT_OPS:
                self.ops.append("." + method)
        else:
            self.ops.append(name)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        self.generic_visit(node)
        self.ops.append(type(node.op).__name__)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        self.generic_visit(node)
        self.ops.append(type(node.op).__name__)


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def signature(source: str) -> Signature:
    """The dedup signals of a task's source; a source that does not parse is its own text."""
    try:
        tree = parse_python(strip_metadata(source))
    except SyntaxError:
        text = " ".join(source.split())
        digest = _hash(text)
        return Signature(digest, digest, text.split(), (), "", digest, (), (), parsed=False)
    aliases = _aliases(tree)
    evaluator = _ConstEvaluator()
    evaluator.read(tree)
    constants = {k: v for k, v in evaluator.values.items() if k not in aliases}
    code: list[ast.stmt] = []
    inputs: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom) or _is_docstring(node):
            continue
        if isinstance(node, ast.FunctionDef) and node.name in INPUT_FUNCTIONS:
            inputs.append(node)
        elif isinstance(node, ast.Assign | ast.AnnAssign) and all(
            isinstance(t, ast.Name) and t.id in constants
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        ):
            continue  # a size constant: part of the shapes, where it is read
        else:
            code.append(node)
    canonical = _Canonical(aliases, constants, inline=False)
    module = ast.Module(body=[canonical.visit(node) for node in code], type_ignores=[])
    computation = ast.dump(module, annotate_fields=False)
    literals = [n.value for n in ast.walk(module) if isinstance(n, ast.Constant)]
    numbers = tuple(v for v in literals if _is_number(v))
    flags = tuple(v for v in literals if not _is_number(v))
    structure = ast.dump(_Blank().visit(copy.deepcopy(module)), annotate_fields=False)
    text = ast.unparse(module)
    ops = _Ops()
    ops.visit(module)
    returns = [
        ast.dump(stmt, annotate_fields=False)
        for node in ast.walk(module)
        if isinstance(node, ast.FunctionDef) and node.name == "forward"
        for stmt in ast.walk(node)
        if isinstance(stmt, ast.Return)
    ]
    shaper = _Canonical(aliases, constants, inline=True)
    shaped = ast.Module(
        body=[shaper.visit(node) for node in sorted(inputs, key=_by_name)], type_ignores=[]
    )
    read = repr(canonical.constants_read)
    shapes_text = " ".join(
        f"{f.name}: " + "; ".join(ast.unparse(stmt) for stmt in f.body)
        for f in shaped.body
        if isinstance(f, ast.FunctionDef)
    )
    if canonical.constants_read:
        shapes_text += f"; constants read by the code: {read}"
    return Signature(
        computation=_hash(computation),
        structure=_hash(structure),
        tokens=_TOKEN.findall(text),
        ops=tuple(ops.ops),
        returns=_hash(" | ".join(returns)),
        shapes=_hash(ast.dump(shaped, annotate_fields=False) + read),
        numbers=numbers,
        flags=flags,
        shapes_text=shapes_text,
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | complex) and not isinstance(value, bool)


class _Blank(ast.NodeTransformer):
    """Blanks numbers, except indices (``state[1]`` picks another output, not another size)."""

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        node.value = self.visit(node.value)
        return node

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        return ast.Constant(value=0) if _is_number(node.value) else node


def _by_name(node: ast.stmt) -> str:
    return getattr(node, "name", "")
