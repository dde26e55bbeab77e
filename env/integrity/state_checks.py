"""Static checks on state a solution keeps: results cached across calls (``output_caching``)
and module globals a ``@triton.jit`` function reads that a GPU compile rejects (``jit_global``)."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from kernelrl.env.integrity.analysis import SolutionAnalysis
from kernelrl.env.integrity.failure import CheckFailure, dedup
from kernelrl.env.integrity.forbidden import MEMO_DECORATORS
from kernelrl.env.integrity.names import (
    flatten_targets,
    is_self_attribute,
    module_of,
    parent_map,
    root_name,
    walk_skipping,
)
from kernelrl.env.integrity.vocabulary import is_glue_method

# Tensor metadata: reading it says nothing about the values, so memoising it is not caching.
_METADATA_ATTRS = frozenset({"shape", "dtype", "device", "ndim", "is_cuda", "layout", "T"})
_METADATA_CALLS = frozenset(
    {"size", "stride", "numel", "dim", "element_size", "data_ptr", "is_contiguous"}
    | {"get_device", "storage_offset", "nelement", "ndimension", "len", "isinstance", "id"}
    | {"type", "is_floating_point"}
)


def check_output_caching(analysis: SolutionAnalysis, ref_ops: set[str]) -> list[CheckFailure]:
    failures = []
    module_names = {
        target.id
        for node in analysis.tree.body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for target in flatten_targets(
            list(node.targets) if isinstance(node, ast.Assign) else [node.target]
        )
        if isinstance(target, ast.Name)
    }

    def fail(message: str, lineno: int | None) -> None:
        failures.append(CheckFailure("output_caching", message, lineno))

    for fn in analysis.forward_path:
        for decorator in getattr(fn, "decorator_list", []):
            name = analysis.resolve(
                decorator.func if isinstance(decorator, ast.Call) else decorator
            )
            if name in MEMO_DECORATORS:
                fail(
                    f"{fn.name} is memoised with {name}: every call must compute its result.",  # type: ignore[attr-defined]
                    fn.lineno,  # type: ignore[attr-defined]
                )
        tainted = _tainted_names(fn, analysis)
        declared_global = {
            name
            for node in ast.walk(fn)
            if isinstance(node, ast.Global | ast.Nonlocal)
            for name in node.names
        }
        defaults = {
            arg.arg
            for arg, default in zip(fn.args.args[::-1], fn.args.defaults[::-1], strict=False)  # type: ignore[attr-defined]
            if isinstance(default, ast.Dict | ast.List | ast.Set)
        }
        for node in walk_skipping(fn, analysis.kernel_defs):
            stores: list[tuple[ast.AST, ast.AST]] = []
            if isinstance(node, ast.Assign):
                stores = [(t, node.value) for t in flatten_targets(list(node.targets))]
            elif isinstance(node, ast.AugAssign | ast.AnnAssign) and node.value is not None:
                stores = [(node.target, node.value)]
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr
                in ("append", "extend", "update", "setdefault", "__setitem__", "insert", "add")
                + ("copy_",)
            ):
                stores = [(node.func.value, ast.Tuple(elts=list(node.args), ctx=ast.Load()))]
            for target, value in stores:
                if not _carries_data(value, tainted):
                    continue
                root = root_name(target)
                persistent = (
                    is_self_attribute(target)
                    or (root is not None and root.id == "self" and not isinstance(target, ast.Name))
                    or (isinstance(target, ast.Name) and target.id in declared_global)
                    or (
                        root is not None
                        and not isinstance(target, ast.Name)
                        and (root.id in module_names or root.id in defaults)
                    )
                )
                if persistent:
                    fail(
                        f"forward stores a value derived from its inputs in "
                        f"{ast.unparse(target)}, which outlives the call; compute the output "
                        "afresh on every call (allocate buffers per call or in __init__).",
                        node.lineno,
                    )
    if analysis.forward is not None:
        failures.extend(_returns_persistent(analysis, module_names))
    return dedup(failures)


def _returns_persistent(analysis: SolutionAnalysis, module_names: set[str]) -> list[CheckFailure]:
    """forward returns a buffer that outlives the call (``self.out``, a module-level tensor,
    a view of either): the next call's caller would see this call's result."""
    forward = analysis.forward
    assert forward is not None
    method_names = set(analysis.methods)

    def persistent_root(expr: ast.AST, local: set[str]) -> str | None:
        while True:
            if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
                if not is_glue_method(expr.func.attr):
                    return None
                expr = expr.func.value
            elif isinstance(expr, ast.Subscript):
                expr = expr.value
            elif is_self_attribute(expr):
                attr = expr.attr  # type: ignore[union-attr]
                return None if attr in method_names else f"self.{attr}"
            elif isinstance(expr, ast.Attribute):
                expr = expr.value
            elif isinstance(expr, ast.Name):
                if expr.id in local:
                    return expr.id
                return (
                    expr.id if expr.id in module_names and expr.id not in analysis.aliases else None
                )
            else:
                return None

    local: set[str] = set()
    for _ in range(2):
        for node in ast.walk(forward):
            if isinstance(node, ast.Assign) and persistent_root(node.value, local):
                local |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    failures = []
    for node in ast.walk(forward):
        if isinstance(node, ast.Return) and node.value is not None:
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            for value in values:
                root = persistent_root(value, local)
                if root:
                    failures.append(
                        CheckFailure(
                            "output_caching",
                            f"forward returns {ast.unparse(value)}, a buffer that outlives the "
                            "call; allocate the output on every call (scratch buffers may be "
                            "reused, outputs may not).",
                            node.lineno,
                        )
                    )
    return failures


def _tainted_names(fn: ast.AST, analysis: SolutionAnalysis) -> set[str]:
    """Parameters (except ``self``) and every local assigned from their data (metadata such as
    shapes does not taint); buffers a kernel or extension call writes into are tainted too."""
    arguments = fn.args  # type: ignore[attr-defined]
    tainted = {
        a.arg
        for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs
        if a.arg not in ("self", "cls")
    }
    tainted |= {a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None}
    for _ in range(3):  # assignments out of order (loops) converge in a few passes
        for node in ast.walk(fn):
            if isinstance(
                node,
                ast.Assign | ast.AugAssign | ast.AnnAssign | ast.For | ast.withitem | ast.NamedExpr,
            ):
                value = (
                    getattr(node, "value", None)
                    or getattr(node, "iter", None)
                    or getattr(node, "context_expr", None)
                )
                target = getattr(node, "target", None) or getattr(node, "optional_vars", None)
                targets = (
                    list(node.targets)
                    if isinstance(node, ast.Assign)
                    else [target]
                    if target is not None
                    else []
                )
                if value is not None and _carries_data(value, tainted):
                    tainted |= {t.id for t in flatten_targets(targets) if isinstance(t, ast.Name)}
            elif (
                isinstance(node, ast.Call)
                and (
                    analysis.launches_kernel(node)
                    or (
                        isinstance(node.func, ast.Attribute)
                        and analysis.is_extension(node.func.value)
                    )
                    or (isinstance(node.func, ast.Name) and node.func.id in analysis.functions)
                    or (isinstance(node.func, ast.Attribute) and is_self_attribute(node.func))
                )
                and _carries_data(node, tainted)
            ):
                # out-parameter kernels: kernel[grid](x, out) writes into `out`
                for argument in node.args:
                    if isinstance(argument, ast.Name):
                        tainted.add(argument.id)
    return tainted


def _carries_data(expr: ast.AST, names: set[str]) -> bool:
    """True when ``expr`` uses the *values* of a tainted name, not only its metadata
    (``x.shape``, ``x.numel()``, ``x.dtype``, ``len(x)``)."""
    parents = parent_map(expr)
    for node in ast.walk(expr):
        if not (isinstance(node, ast.Name) and node.id in names):
            continue
        parent = parents.get(id(node))
        if isinstance(parent, ast.Attribute) and parent.attr in _METADATA_ATTRS:
            continue
        if isinstance(parent, ast.Attribute) and parent.attr in _METADATA_CALLS:
            grand = parents.get(id(parent))
            if isinstance(grand, ast.Call) and grand.func is parent:
                continue
        if (
            isinstance(parent, ast.Call)
            and isinstance(parent.func, ast.Name)
            and parent.func.id in _METADATA_CALLS
        ):
            continue
        return True
    return False


def check_jit_global(analysis: SolutionAnalysis, ref_ops: set[str]) -> list[CheckFailure]:
    """Triton compiles a kernel's globals only if they are constexpr, modules, jit functions or
    triton values; the CPU interpreter runs plain Python and accepts any global, so the CPU
    verdict would be contradicted on a GPU."""
    allowed: set[str] = set(analysis.names.imports) | set(analysis.kernels)
    forbidden: dict[str, str] = {}
    for stmt in _module_statements(analysis.tree.body):
        if isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            annotation = (
                analysis.resolve(stmt.annotation) if isinstance(stmt, ast.AnnAssign) else None
            )
            value = analysis.resolve(stmt.value)
            callee = analysis.resolve(stmt.value.func) if isinstance(stmt.value, ast.Call) else None
            ok = (
                annotation in ("triton.language.constexpr", "triton.language.core.constexpr")
                or callee in ("triton.language.constexpr", "triton.language.core.constexpr")
                or (value is not None and module_of(value) == "triton")
                or (
                    callee is not None
                    and module_of(callee) == "triton"
                    and callee.count(".") > 1
                    and callee.endswith(("jit", "autotune", "heuristics"))
                )
            )
            for target in flatten_targets(list(targets)):
                if isinstance(target, ast.Name):
                    (allowed.add(target.id) if ok else forbidden.__setitem__(target.id, "value"))
        elif (
            isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and stmt.name not in analysis.kernels
        ):
            forbidden[stmt.name] = "function" if not isinstance(stmt, ast.ClassDef) else "class"
    forbidden = {k: v for k, v in forbidden.items() if k not in allowed}
    failures = []
    for kernel in analysis.kernel_defs:
        local = {a.arg for a in kernel.args.posonlyargs + kernel.args.args + kernel.args.kwonlyargs}
        local |= {
            n.id
            for body in kernel.body
            for n in ast.walk(body)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
        }
        for body in kernel.body:
            for node in ast.walk(body):
                if (
                    isinstance(node, ast.Name)
                    and isinstance(node.ctx, ast.Load)
                    and node.id not in local
                    and node.id in forbidden
                ):
                    what = (
                        "non-jit Python " + forbidden[node.id]
                        if forbidden[node.id] != "value"
                        else "module global"
                    )
                    failures.append(
                        CheckFailure(
                            "jit_global",
                            f"the @triton.jit function {kernel.name} reads the {what} "
                            f"{node.id!r}; it runs under the CPU interpreter but does not compile "
                            f"on a GPU. Declare it `{node.id} = tl.constexpr(...)`, decorate it "
                            "with @triton.jit, or pass it as an argument.",
                            node.lineno,
                        )
                    )
    return dedup(failures)


def _module_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If | ast.Try | ast.With):
            for block in ("body", "orelse", "finalbody"):
                yield from _module_statements(getattr(stmt, block, []))
            for handler in getattr(stmt, "handlers", []):
                yield from _module_statements(handler.body)
