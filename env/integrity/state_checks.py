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
_METADATA_ATTRS = frozenset({"shape", "dtype", "device", "ndim", "is_cuda", "layout"})
_METADATA_CALLS = frozenset(
    {"size", "stride", "numel", "dim", "element_size", "data_ptr", "is_contiguous"}
    | {"get_device", "storage_offset", "nelement", "ndimension", "len", "isinstance", "id"}
    | {"type", "is_floating_point"}
)
# Allocations whose values depend only on metadata: the tensor they are given (``empty_like``'s
# template, ``new_empty``'s receiver) lends its shape, dtype and device, never its data.
_LIKE_ALLOCATIONS = frozenset({"empty_like", "zeros_like", "ones_like", "full_like"})
_NEW_ALLOCATIONS = frozenset(
    {"new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full"}
)
_SHAPE_ALLOCATIONS = frozenset({"empty", "empty_strided", "zeros", "ones", "full", "arange"})


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

    flow = _DataFlow(analysis)
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
    flow = _DataFlow(analysis)
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


class _DataFlow:
    """Which values carry the *data* of a function's inputs, followed through the solution's
    own helpers.

    Metadata (shapes, dtypes, devices, sizes) and allocations sized from it (``empty_like(x)``,
    ``torch.empty(x.shape)``, ``x.new_zeros(n)``) carry none: a buffer or launch config cached
    by shape is not a cached result. A call to a solution function carries data only when it is
    given data and that function returns something derived from its arguments' data.

    A buffer a kernel (or a solution helper) is given together with the inputs holds data from
    that launch on (``written_after``): stored afterwards it is a computed result kept for a
    later call; stored before, it is an empty workspace the launch then fills, which is scratch.
    Returning a persistent buffer is caught apart (``_returns_persistent`` statically, the
    sandbox's ``output_reused`` with fresh inputs on every call dynamically).
    """

    def __init__(self, analysis: SolutionAnalysis) -> None:
        self.analysis = analysis
        self._returns: dict[int, bool] = {}
        self._data_parameters: dict[int, set[str] | None] = {}

    def callees(self, call: ast.Call) -> list[ast.AST]:
        """The solution functions or methods a call runs (``helper(x)``, ``self._helper(x)``)."""
        func = call.func
        if isinstance(func, ast.Name) and func.id in self.analysis.functions:
            return [self.analysis.functions[func.id]]
        if is_self_attribute(func):
            return list(self.analysis.methods.get(func.attr, []))  # type: ignore[union-attr]
        return []

    def returns_data(self, fn: ast.AST) -> bool:
        """``fn`` returns (or yields) a value derived from its arguments' data."""
        key = id(fn)
        if key not in self._returns:
            self._returns[key] = True  # recursion: assume the worst until known
            tainted = self.tainted_names(fn)
            if isinstance(fn, ast.Lambda):
                values: list[ast.AST] = [fn.body]
            else:
                values = [
                    node.value
                    for node in walk_skipping(fn, self.analysis.kernel_defs)
                    if isinstance(node, ast.Return | ast.Yield | ast.YieldFrom)
                    and node.value is not None
                ]
            self._returns[key] = any(self.carries(v, tainted) for v in values)
        return self._returns[key]

    def tainted_names(self, fn: ast.AST, parameters: set[str] | None = None) -> set[str]:
        """Parameters (except ``self``; only ``parameters`` when given) and every local assigned
        from their data."""
        arguments = fn.args  # type: ignore[attr-defined]
        tainted = {
            a.arg
            for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs
            if a.arg not in ("self", "cls")
        }
        tainted |= {a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None}
        if parameters is not None:
            tainted &= parameters
        for _ in range(3):  # assignments out of order (loops) converge in a few passes
            for node in ast.walk(fn):
                if not isinstance(
                    node,
                    ast.Assign
                    | ast.AugAssign
                    | ast.AnnAssign
                    | ast.For
                    | ast.withitem
                    | ast.NamedExpr,
                ):
                    continue
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
                if value is not None and self.carries(value, tainted):
                    tainted |= {t.id for t in flatten_targets(targets) if isinstance(t, ast.Name)}
        return tainted

    def data_parameters(self, fn: ast.AST) -> set[str] | None:
        """The parameters of a helper that some call on the forward path passes data (a
        ``_config(self, M, N)`` called with shapes gets none); ``None`` when a call is not seen
        or cannot be read (the helper is reached through a table, ``*args``), and every
        parameter then counts as data."""
        if fn is self.analysis.forward or isinstance(fn, ast.Lambda):
            return None
        key = id(fn)
        if key not in self._data_parameters:
            self._data_parameters[key] = None  # recursion: every parameter until known
            self._data_parameters[key] = self._parameters_given_data(fn)
        return self._data_parameters[key]

    def _parameters_given_data(self, fn: ast.AST) -> set[str] | None:
        arguments = fn.args  # type: ignore[attr-defined]
        positional = [a.arg for a in arguments.posonlyargs + arguments.args]
        if positional and positional[0] in ("self", "cls"):
            positional = positional[1:]
        data: set[str] = set()
        seen_call = False
        for caller in self.analysis.forward_path:
            nodes = list(walk_skipping(caller, self.analysis.kernel_defs))
            calls = [n for n in nodes if isinstance(n, ast.Call) and fn in self.callees(n)]
            callee_nodes = {id(call.func) for call in calls}
            for node in nodes:  # reached as a value too (an alias, a table, partial): unknown
                if (
                    isinstance(node, ast.Name | ast.Attribute)
                    and isinstance(node.ctx, ast.Load)
                    and id(node) not in callee_nodes
                    and fn in self.analysis.referenced(node)
                ):
                    return None
            if not calls:
                continue
            caller_tainted = self.tainted_names(caller, self.data_parameters(caller))
            for call in calls:
                seen_call = True
                if any(isinstance(a, ast.Starred) for a in call.args) or any(
                    k.arg is None for k in call.keywords
                ):
                    return None
                for index, argument in enumerate(call.args):
                    if self.carries(argument, caller_tainted):
                        if index >= len(positional):
                            return None
                        data.add(positional[index])
                for keyword in call.keywords:
                    if self.carries(keyword.value, caller_tainted):
                        data.add(str(keyword.arg))
        return data if seen_call else None

    def written_after(self, fn: ast.AST, tainted: set[str]) -> dict[str, int]:
        """Names of buffers a launch given data writes into (``kernel[grid](x, out)``,
        ``helper(x, out)``), each with the first line from which it holds data: the launch's,
        or the start of the loop around it (a later iteration runs after it)."""
        parents = parent_map(fn)
        written: dict[str, int] = {}
        for node in walk_skipping(fn, self.analysis.kernel_defs):
            if not (isinstance(node, ast.Call) and self._launches(node)):
                continue
            arguments = list(node.args) + [k.value for k in node.keywords]
            if not any(self.carries(a, tainted) for a in arguments):
                continue
            line = node.lineno
            parent = parents.get(id(node))
            while parent is not None:
                if isinstance(parent, ast.For | ast.While | ast.AsyncFor):
                    line = parent.lineno
                parent = parents.get(id(parent))
            for argument in arguments:
                if isinstance(argument, ast.Name):
                    written[argument.id] = min(line, written.get(argument.id, line))
        return written

    def _launches(self, call: ast.Call) -> bool:
        """A kernel launch, an extension call or a call of the solution's own code."""
        func = call.func
        return (
            self.analysis.launches_kernel(call)
            or (isinstance(func, ast.Attribute) and self.analysis.is_extension(func.value))
            or bool(self.callees(call))
        )

    def carries(self, expr: ast.AST, names: set[str], *, pointer_is_data: bool = False) -> bool:
        """True when ``expr`` uses the *values* of a tainted name, not only its metadata
        (``x.shape``, ``x.numel()``, ``len(x)``, ``torch.empty_like(x)``). With
        ``pointer_is_data`` a buffer's address counts as its data (a memo key)."""

        def rec(node: ast.AST) -> bool:
            return self.carries(node, names, pointer_is_data=pointer_is_data)

        if isinstance(expr, ast.Name):
            return expr.id in names
        if isinstance(expr, ast.Attribute):
            return expr.attr not in _METADATA_ATTRS and rec(expr.value)
        if not isinstance(expr, ast.Call):
            return any(rec(child) for child in ast.iter_child_nodes(expr))
        func = expr.func
        args = list(expr.args) + [k.value for k in expr.keywords]
        if (
            isinstance(func, ast.Attribute)
            and func.attr in _METADATA_CALLS
            and not (pointer_is_data and func.attr == "data_ptr")
        ):
            return any(rec(a) for a in args)  # the receiver is read for metadata only
        if (
            isinstance(func, ast.Name)
            and func.id in _METADATA_CALLS
            and func.id not in self.analysis.functions
        ):
            return False
        qualified = self.analysis.resolve(func)
        leaf = qualified.rsplit(".", 1)[-1] if qualified and module_of(qualified) == "torch" else ""
        if leaf in _LIKE_ALLOCATIONS:
            return any(rec(a) for a in args[1:])  # the template lends metadata only
        if leaf in _SHAPE_ALLOCATIONS:
            return any(rec(a) for a in args)
        if not qualified and isinstance(func, ast.Attribute) and func.attr in _NEW_ALLOCATIONS:
            return any(rec(a) for a in args)
        callees = self.callees(expr)
        if callees:
            return any(rec(a) for a in args) and any(self.returns_data(c) for c in callees)
        return rec(func) or any(rec(a) for a in args)


def _memo_on_data(analysis: SolutionAnalysis, flow: _DataFlow) -> list[tuple[ast.AST, str, str]]:
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
