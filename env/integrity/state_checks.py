"""Static checks on state a solution keeps: results cached across calls (``output_caching``)
and module globals a ``@triton.jit`` function reads that a GPU compile rejects (``jit_global``)."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from kernelrl.env.integrity.analysis import SolutionAnalysis
from kernelrl.env.integrity.data_flow import DataFlow
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

    flow = DataFlow(analysis)
    for fn, name, why in _memo_on_data(analysis, flow):
        fail(
            f"{fn.name} is memoised with {name} {why}: every call must compute its result "  # type: ignore[attr-defined]
            "(memoise only shapes, dtypes and other metadata, such as launch configs).",
            fn.lineno,  # type: ignore[attr-defined]
        )
    for fn in analysis.forward_path:
        tainted = flow.tainted_names(fn, flow.data_parameters(fn))
        written = flow.written_after(fn, tainted)
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
            if not stores:
                continue
            line = getattr(node, "lineno", 0)
            filled = {name for name, first in written.items() if first <= line}
            for target, value in stores:
                if not flow.carries(value, tainted | filled):
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
    a view of either, or one a solution helper returns): the next call's caller would see this
    call's result. Scratch buffers may persist; only returning one is caching."""
    forward = analysis.forward
    assert forward is not None
    method_names = set(analysis.methods)
    flow = DataFlow(analysis)
    helper_returns: dict[int, str | None] = {}

    def persistent_root(expr: ast.AST, local: dict[str, str]) -> str | None:
        while True:
            if isinstance(expr, ast.Call):
                callees = flow.callees(expr)
                if callees:
                    return next(
                        (r for c in callees if (r := helper_root(c)) is not None),
                        None,
                    )
                if not (isinstance(expr.func, ast.Attribute) and is_glue_method(expr.func.attr)):
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
                    return local[expr.id]
                return (
                    expr.id if expr.id in module_names and expr.id not in analysis.aliases else None
                )
            else:
                return None

    def locals_of(fn: ast.AST) -> dict[str, str]:
        local: dict[str, str] = {}
        for _ in range(2):
            for node in ast.walk(fn):
                if isinstance(node, ast.Assign) and (root := persistent_root(node.value, local)):
                    local.update({t.id: root for t in node.targets if isinstance(t, ast.Name)})
        return local

    def helper_root(fn: ast.AST) -> str | None:
        """The persistent buffer a solution helper returns (``self._workspace(x)``), if any."""
        if id(fn) not in helper_returns:
            helper_returns[id(fn)] = None  # recursion
            local = locals_of(fn)
            values = (
                [fn.body]
                if isinstance(fn, ast.Lambda)
                else [n.value for n in ast.walk(fn) if isinstance(n, ast.Return) and n.value]
            )
            helper_returns[id(fn)] = next(
                (r for v in values if (r := persistent_root(v, local)) is not None), None
            )
        return helper_returns[id(fn)]

    local = locals_of(forward)
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
                            f"call ({root}); allocate the output on every call (scratch buffers "
                            "may be reused, outputs may not).",
                            node.lineno,
                        )
                    )
    return failures


def _memo_on_data(analysis: SolutionAnalysis, flow: DataFlow) -> list[tuple[ast.AST, str, str]]:
    """Memoised functions on the forward path whose cache can hold a result: one called with
    an argument that carries data (a tensor, its values, its address), one whose cached value
    is computed from ``self`` (``cached_property``), or one referenced other than by a direct
    call (its arguments cannot be seen). Memoising on metadata alone (a launch config or
    scratch buffer keyed by shape and dtype) computes nothing from the inputs' values."""
    memoised: dict[int, str] = {}
    for fn in analysis.forward_path:
        for decorator in getattr(fn, "decorator_list", []):
            name = analysis.resolve(
                decorator.func if isinstance(decorator, ast.Call) else decorator
            )
            if name in MEMO_DECORATORS:
                memoised[id(fn)] = name
    if not memoised:
        return []
    found: dict[int, tuple[ast.AST, str, str]] = {}
    for fn in analysis.forward_path:
        if id(fn) in memoised and memoised[id(fn)] == "functools.cached_property":
            found[id(fn)] = (fn, memoised[id(fn)], "(a value cached on the instance)")
        tainted = flow.tainted_names(fn)
        parents = parent_map(fn)
        for node in walk_skipping(fn, analysis.kernel_defs):
            if not (isinstance(node, ast.Name | ast.Attribute) and isinstance(node.ctx, ast.Load)):
                continue
            if isinstance(node, ast.Attribute) and not is_self_attribute(node):
                continue
            targets = [
                t
                for t in (
                    [analysis.functions[node.id]]
                    if isinstance(node, ast.Name) and node.id in analysis.functions
                    else analysis.methods.get(node.attr, [])  # type: ignore[union-attr]
                    if isinstance(node, ast.Attribute)
                    else []
                )
                if id(t) in memoised
            ]
            if not targets:
                continue
            call = parents.get(id(node))
            if not (isinstance(call, ast.Call) and call.func is node):
                why = "and passed around uncalled"
            elif any(
                flow.carries(a, tainted, pointer_is_data=True)
                for a in list(call.args) + [k.value for k in call.keywords]
            ):
                why = f"and called with data ({ast.unparse(call)[:60]})"
            else:
                continue
            for target in targets:
                found.setdefault(id(target), (target, memoised[id(target)], why))
    return list(found.values())


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
