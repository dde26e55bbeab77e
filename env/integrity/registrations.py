"""What a solution registers or compiles: ops it registers from its own functions with
``torch.library`` (their bodies and further implementations run when the op is called) and the
names bound to extensions it compiles with ``load_inline`` (their methods are its CUDA code).
``SolutionAnalysis`` reads both once."""

from __future__ import annotations

import ast

from kernelrl.env.integrity.names import Names, bindings, is_self_attribute, parent_map
from kernelrl.env.parse import is_cpp_extension_call

# PyTorch's documented ways to register a Python function as an op (``torch.ops.ns.name``):
# calling the op runs that function, so it is the solution's own code, not torch compute.
OP_REGISTRARS = frozenset(
    {
        "torch.library.custom_op",
        "torch.library.triton_op",
        "torch._library.custom_ops.custom_op",
        "torch._library.triton.triton_op",
    }
)
# Registering another implementation for an op (``@op.register_kernel("cpu")``,
# ``torch.library.register_kernel("ns::op", "cpu", fn)``): calling the op may run it instead.
IMPL_REGISTRARS = frozenset(
    {"register_kernel", "register_torch_dispatch", "register_autograd", "register_vmap", "impl"}
)


def registered_ops(
    tree: ast.Module, names: Names, functions: dict[str, ast.AST]
) -> tuple[dict[str, ast.AST], dict[int, list[ast.AST]]]:
    """Ops the solution registers from its own functions, ``"ns::name" -> function``:
    ``@custom_op("ns::name", ...)``/``@triton_op(...)`` on a def, ``op = custom_op("ns::name",
    fn, ...)`` and ``op = triton_op("ns::name", ...)(fn)``. A name bound to the op object is
    made a function name too (in ``functions``), so calls through it reach the body. With them,
    the further implementations registered for each (``op_impls``)."""
    ops: dict[str, ast.AST] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for decorator in node.decorator_list:
                name = _op_name(names, decorator)
                if name:
                    ops[name] = node
    for target, value in bindings(tree):
        if not isinstance(value, ast.Call):
            continue
        name = _op_name(names, value.func)  # triton_op("ns::n", ...)(fn)
        fn_node = value.args[0] if name and value.args else None
        if name is None and len(value.args) >= 2:  # custom_op("ns::n", fn, ...)
            name = _op_name(names, value)
            fn_node = value.args[1] if name else None
        if name and isinstance(fn_node, ast.Name) and fn_node.id in functions:
            ops[name] = functions[fn_node.id]
            if isinstance(target, ast.Name):
                functions.setdefault(target.id, ops[name])
    return ops, _op_impls(tree, names, functions, ops)


def _op_impls(
    tree: ast.Module, names: Names, functions: dict[str, ast.AST], ops: dict[str, ast.AST]
) -> dict[int, list[ast.AST]]:
    """Further implementations registered for the solution's ops (device kernels, dispatch
    rules, autograd), by the op's main function: they run when the op is called, so they
    join the forward path with it."""
    by_python_name = {
        name: fn for name, fn in functions.items() if any(fn is o for o in ops.values())
    }
    impls: dict[int, list[ast.AST]] = {}
    parents = parent_map(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        op_fn: ast.AST | None = None
        if (
            isinstance(func, ast.Attribute)
            and func.attr in IMPL_REGISTRARS
            and isinstance(func.value, ast.Name)
        ):
            op_fn = by_python_name.get(func.value.id)
        qualified = names.resolve(func) or ""
        if qualified.startswith("torch.library.") and qualified.rsplit(".", 1)[-1] in (
            IMPL_REGISTRARS
        ):
            first = node.args[0] if node.args else None
            name = names.const(first)
            op_fn = ops.get(name or "") or (
                by_python_name.get(first.id) if isinstance(first, ast.Name) else None
            )
        if op_fn is None:
            continue
        registered: list[ast.AST] = []
        parent = parents.get(id(node))
        calls = [node] + ([parent] if isinstance(parent, ast.Call) else [])
        for call in calls:
            for argument in list(call.args) + [k.value for k in call.keywords]:  # type: ignore[attr-defined]
                if isinstance(argument, ast.Lambda):
                    registered.append(argument)
                elif isinstance(argument, ast.Name) and argument.id in functions:
                    registered.append(functions[argument.id])
        if isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef) and (
            node in parent.decorator_list
        ):
            registered.append(parent)
        impls.setdefault(id(op_fn), []).extend(r for r in registered if r is not op_fn)
    return impls


def _op_name(names: Names, node: ast.AST) -> str | None:
    """``"ns::name"`` when ``node`` is a registrar call ``custom_op("ns::name", ...)``."""
    if not (isinstance(node, ast.Call) and names.resolve(node.func) in OP_REGISTRARS):
        return None
    first = node.args[0] if node.args else None
    for keyword in node.keywords:
        if keyword.arg == "name":
            first = keyword.value
    name = names.const(first)
    return name if name and "::" in name else None


def cpp_extension_bindings(tree: ast.Module, imports: dict[str, str]) -> tuple[set[str], set[str]]:
    """Names and ``self`` attributes bound to a ``load_inline`` result, and functions that
    return one (lazy loaders)."""
    names: set[str] = set()
    loaders: set[str] = set()
    functions = {
        n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    for fn in functions.values():
        for node in ast.walk(fn):
            if (
                isinstance(node, ast.Return)
                and node.value is not None
                and is_cpp_extension_call(node.value, imports)
            ):
                loaders.add(fn.name)
    changed = True
    while changed:
        changed = False
        for node in ast.walk(tree):
            if not isinstance(node, ast.Assign):
                continue
            value = node.value
            bound = (
                is_cpp_extension_call(value, imports)
                or (
                    isinstance(value, ast.Call)
                    and isinstance(value.func, ast.Name)
                    and value.func.id in loaders
                )
                or (isinstance(value, ast.Name) and value.id in names)
            )
            if not bound:
                continue
            for target in node.targets:
                key = (
                    target.id
                    if isinstance(target, ast.Name)
                    else target.attr
                    if is_self_attribute(target)
                    else None
                )
                if key and key not in names:
                    names.add(key)
                    changed = True
        for fn in functions.values():
            if fn.name in loaders:
                continue
            for node in ast.walk(fn):
                if (
                    isinstance(node, ast.Return)
                    and isinstance(node.value, ast.Name)
                    and node.value.id in names
                ):
                    loaders.add(fn.name)
                    changed = True
                    break
    return names, loaders
