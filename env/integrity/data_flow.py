"""Which values in a solution carry the *data* of its inputs, as opposed to their metadata:
what ``output_caching`` asks of every value a forward call stores where it outlives the call.

Metadata (shapes, dtypes, devices, sizes), allocations sized from it and objects of the
solution's own classes built only from it (a launch plan holding block sizes) carry none: a
buffer, launch config or plan kept by shape is not a cached result.
"""

from __future__ import annotations

import ast

from kernelrl.env.integrity.analysis import SolutionAnalysis
from kernelrl.env.integrity.names import (
    flatten_targets,
    is_self_attribute,
    module_of,
    parent_map,
    walk_skipping,
)

# Tensor metadata: reading it says nothing about the values, so memoising it is not caching.
METADATA_ATTRS = frozenset({"shape", "dtype", "device", "ndim", "is_cuda", "layout"})
METADATA_CALLS = frozenset(
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


class DataFlow:
    """Which values carry the *data* of a function's inputs, followed through the solution's
    own helpers.

    Metadata (shapes, dtypes, devices, sizes) and allocations sized from it (``empty_like(x)``,
    ``torch.empty(x.shape)``, ``x.new_zeros(n)``) carry none: a buffer or launch config cached
    by shape is not a cached result. A call to a solution function carries data only when it is
    given data and that function returns something derived from its arguments' data; an object
    of the solution's own class (``Plan(x.shape[1])``) carries what it is built from, and its
    constructor is analysed as a function called with those arguments.

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
        """The solution functions or methods a call runs (``helper(x)``, ``self._helper(x)``,
        ``Plan(n)``: its class's ``__init__``)."""
        func = call.func
        if isinstance(func, ast.Name) and func.id in self.analysis.functions:
            return [self.analysis.functions[func.id]]
        if is_self_attribute(func):
            return list(self.analysis.methods.get(func.attr, []))  # type: ignore[union-attr]
        cls = self.constructed_class(call)
        init = self.analysis.method(cls, "__init__") if cls else None
        return [init] if init is not None else []

    def constructed_class(self, call: ast.Call) -> str | None:
        """The solution's own class that ``call`` instantiates (``Plan(x.shape[1])``)."""
        func = call.func
        if (
            isinstance(func, ast.Name)
            and func.id in self.analysis.classes
            and func.id not in self.analysis.functions
        ):
            return func.id
        return None

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
            seen = {id(call.func) for call in calls} | _type_uses(caller)
            for node in nodes:  # reached as a value too (an alias, a table, partial): unknown
                if (
                    isinstance(node, ast.Name | ast.Attribute)
                    and isinstance(node.ctx, ast.Load)
                    and id(node) not in seen
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
        return self._holding(fn, written)

    def _holding(self, fn: ast.AST, written: dict[str, int]) -> dict[str, int]:
        """``written`` with the names assigned, after a buffer holds data, a value that holds
        that buffer (``plan = Plan(n, out)``, ``entry = (out, n)``), from that line on."""
        assignments = [
            node
            for node in walk_skipping(fn, self.analysis.kernel_defs)
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None
        ]
        for _ in range(3):  # chains of such names converge in a few passes
            for node in assignments:
                line = node.lineno
                held = {name for name, first in written.items() if first <= line}
                if not held or not self.carries(node.value, held):  # type: ignore[arg-type]
                    continue
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in flatten_targets(list(targets)):
                    if isinstance(target, ast.Name):
                        written[target.id] = min(line, written.get(target.id, line))
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
            return expr.attr not in METADATA_ATTRS and rec(expr.value)
        if not isinstance(expr, ast.Call):
            return any(rec(child) for child in ast.iter_child_nodes(expr))
        func = expr.func
        args = list(expr.args) + [k.value for k in expr.keywords]
        if (
            isinstance(func, ast.Attribute)
            and func.attr in METADATA_CALLS
            and not (pointer_is_data and func.attr == "data_ptr")
        ):
            return any(rec(a) for a in args)  # the receiver is read for metadata only
        if (
            isinstance(func, ast.Name)
            and func.id in METADATA_CALLS
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
        if self.constructed_class(expr):
            return any(rec(a) for a in args)  # an object of its own holds what it is given
        callees = self.callees(expr)
        if callees:
            return any(rec(a) for a in args) and any(self.returns_data(c) for c in callees)
        return rec(func) or any(rec(a) for a in args)


def _type_uses(fn: ast.AST) -> set[int]:
    """Nodes that name a class as a type, not as something to call: annotations and the type
    argument of ``isinstance``/``issubclass``. They construct nothing."""
    uses: set[int] = set()
    for node in ast.walk(fn):
        annotations: list[ast.AST | None] = []
        if isinstance(node, ast.AnnAssign | ast.arg):
            annotations = [node.annotation]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            annotations = [node.returns]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("isinstance", "issubclass")
            and len(node.args) == 2
        ):
            annotations = [node.args[1]]
        for annotation in annotations:
            if annotation is not None:
                uses.update(id(n) for n in ast.walk(annotation))
    return uses
