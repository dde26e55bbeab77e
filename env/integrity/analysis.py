"""Everything the static checks share about one solution, computed once.

Its names (``names.Names``), its kernels, classes and methods, which ``self`` attributes and
names hold layers, containers, kernels or a compiled extension, and the *forward path*: every
function reachable from ``ModelNew.forward`` (and ``__call__``, forward hooks) through the
functions, methods, lambdas and classes the solution defines (kernel bodies excluded: they are
device code).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from kernelrl.env.integrity.names import (
    Names,
    bindings,
    flatten_targets,
    holder_key,
    is_self_attribute,
    walk_skipping,
)
from kernelrl.env.integrity.registrations import cpp_extension_bindings, registered_ops
from kernelrl.env.integrity.vocabulary import is_passive_layer
from kernelrl.env.parse import triton_kernels
from kernelrl.env.python_syntax import parse_python

_CONTAINER_CALLS = frozenset(
    {"dict", "list", "set", "tuple", "sorted", "frozenset", "str", "defaultdict", "OrderedDict"}
)
_HOOK_REGISTRARS = frozenset(
    {"register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook"}
)
# Wrappers that hand a Triton kernel to torch's tracing (``wrap_triton(k)[grid](...)``): in eager
# mode they launch ``k`` itself.
TRITON_WRAPPERS = frozenset(
    {
        "torch.library.wrap_triton",
        "torch.library.capture_triton",
        "torch._library.triton.wrap_triton",
        "torch._library.triton.capture_triton",
    }
)


class SolutionAnalysis:
    """Everything the checks share, computed once: names, kernels, classes, forward path."""

    def __init__(self, source: str, backend: str) -> None:
        self.tree = parse_python(source)
        self.backend = backend
        self.names = Names(self.tree)
        self.aliases = self.names.aliases
        self.kernels = triton_kernels(self.tree, self.names.imports)
        kernel_functions = set(self.kernels.values())
        self.kernel_defs = {
            node
            for node in ast.walk(self.tree)
            if isinstance(node, ast.FunctionDef) and node.name in kernel_functions
        }
        self.classes = {n.name: n for n in ast.walk(self.tree) if isinstance(n, ast.ClassDef)}
        self.methods: dict[str, list[ast.AST]] = {}
        method_nodes = set()
        for cls in self.classes.values():
            for item in cls.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    self.methods.setdefault(item.name, []).append(item)
                    method_nodes.add(item)
        # Functions by name: module-level and nested defs, and names bound to lambdas.
        self.functions: dict[str, ast.AST] = {}
        for node in ast.walk(self.tree):
            if (
                isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                and node not in method_nodes
                and node not in self.kernel_defs
            ):
                self.functions.setdefault(node.name, node)
        for target, value in bindings(self.tree):
            if isinstance(target, ast.Name) and isinstance(value, ast.Lambda):
                self.functions.setdefault(target.id, value)
        # Module-level names and ``self.`` attributes bound to another name or attribute
        # (``layer_norm = LayerNormFn.apply``, ``self.fn = _impl``): what they reference is
        # reached through them. A function's own locals are not followed (another function's
        # local of the same name would bring its value onto the wrong path).
        module_level = {
            id(t)
            for node in self.tree.body
            if isinstance(node, ast.Assign | ast.AnnAssign)
            for t, _ in bindings(node)
        }
        aliases: dict[str, list[ast.AST]] = {}
        for target, value in bindings(self.tree):
            if not isinstance(value, ast.Name | ast.Attribute):
                continue
            if is_self_attribute(target) or (
                isinstance(target, ast.Name) and id(target) in module_level
            ):
                aliases.setdefault(holder_key(target) or "", []).append(value)
        self.callable_aliases = _alias_closure(aliases)
        self.registered_ops, self.op_impls = registered_ops(self.tree, self.names, self.functions)
        self.attribute_types = self._attribute_types()
        self.layer_attrs, self.layer_names = self._layers()
        self.instances = self._instances()
        self.containers = self._containers()
        self.kernel_holders = self._kernel_holders()
        self.extension_names, self.loader_functions = cpp_extension_bindings(
            self.tree, self.names.imports
        )
        self.forward = self.method("ModelNew", "forward")
        roots = [m for m in (self.forward, self.method("ModelNew", "__call__")) if m is not None]
        roots += self._hooks()
        self.forward_path = self._reachable(roots) if self.forward else []
        self.compute_path = self._compute_path()

    def resolve(self, node: ast.AST) -> str | None:
        return self.names.resolve(node)

    def method(self, class_name: str, method: str) -> ast.FunctionDef | None:
        cls = self.classes.get(class_name)
        seen: set[str] = set()
        while cls is not None and cls.name not in seen:
            seen.add(cls.name)
            for item in cls.body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    return item
            bases = [b.id for b in cls.bases if isinstance(b, ast.Name) and b.id in self.classes]
            cls = self.classes[bases[0]] if bases else None
        return None

    def own_op(self, qualified: str | None) -> ast.AST | None:
        """The solution function behind ``torch.ops.ns.name`` (or ``.overload``), if the
        solution registered ``ns::name`` itself."""
        parts = (qualified or "").split(".")
        if len(parts) in (4, 5) and parts[:2] == ["torch", "ops"]:
            return self.registered_ops.get(f"{parts[2]}::{parts[3]}")
        return None

    def _attribute_types(self) -> dict[str, str]:
        """``self.x = Something(...)`` anywhere -> ``{"x": "Something" or "torch.nn.Conv2d"}``."""
        types: dict[str, str] = {}
        for target, value in bindings(self.tree):
            if isinstance(value, ast.Call) and is_self_attribute(target):
                callee = value.func
                name = (
                    callee.id
                    if isinstance(callee, ast.Name) and callee.id in self.classes
                    else self.resolve(callee)
                )
                if name:
                    types[target.attr] = name  # type: ignore[union-attr]
        return types

    def _layers(self) -> tuple[dict[str, str], dict[str, str]]:
        """``self`` attributes and names holding a computing ``nn`` layer, directly or inside
        a container (``nn.Sequential(nn.Linear(...))``, ``nn.ModuleList([...])``), and loop
        variables iterating over one."""
        attrs: dict[str, str] = {}
        names: dict[str, str] = {}
        for target, value in bindings(self.tree):
            layer = next(
                (
                    q
                    for n in ast.walk(value)
                    if isinstance(n, ast.Call)
                    and (q := self.resolve(n.func))
                    and q.startswith("torch.nn.")
                    and q.rsplit(".", 1)[1][:1].isupper()
                    and not is_passive_layer(q)
                ),
                None,
            )
            if layer is None:
                continue
            if is_self_attribute(target):
                attrs[target.attr] = layer  # type: ignore[union-attr]
            elif isinstance(target, ast.Name):
                names[target.id] = layer
        for node in ast.walk(self.tree):
            if isinstance(node, ast.For) and isinstance(node.target, ast.Name):
                owner = self.layer_of(node.iter, attrs, names)
                if owner:
                    names[node.target.id] = owner
        return attrs, names

    def layer_of(
        self,
        node: ast.AST,
        attrs: dict[str, str] | None = None,
        names: dict[str, str] | None = None,
    ) -> str | None:
        """The computing nn layer an expression (``self.fc``, ``self.blocks[0]``, ``layer``)
        holds, if any."""
        attrs = self.layer_attrs if attrs is None else attrs
        names = self.layer_names if names is None else names
        while isinstance(node, ast.Subscript) or (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("children", "modules", "values")
        ):
            node = node.value if isinstance(node, ast.Subscript) else node.func.value  # type: ignore[union-attr]
        if is_self_attribute(node):
            return attrs.get(node.attr)  # type: ignore[union-attr]
        if isinstance(node, ast.Name):
            return names.get(node.id)
        return None

    def _instances(self) -> set[str]:
        """Names bound to instances of the solution's own classes."""
        return {
            target.id
            for target, value in bindings(self.tree)
            if isinstance(target, ast.Name)
            and isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id in self.classes
        }

    def _containers(self) -> set[str]:
        """Names and ``self.`` attributes (as ``self.x``) bound to Python containers."""
        found: set[str] = set()
        for target, value in bindings(self.tree):
            is_container = isinstance(
                value, ast.Dict | ast.List | ast.Set | ast.Tuple | ast.DictComp | ast.ListComp
            ) or (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Name | ast.Attribute)
                and (value.func.id if isinstance(value.func, ast.Name) else value.func.attr)
                in _CONTAINER_CALLS
            )
            if is_container and isinstance(target, ast.Name):
                found.add(target.id)
            elif is_container and is_self_attribute(target):
                found.add("self." + target.attr)  # type: ignore[union-attr]
        return found

    def _kernel_holders(self) -> set[str]:
        """Kernel names plus names/``self.`` attributes bound to anything mentioning a kernel:
        dispatch tables, ``k = a if c else b``, ``self._kernels[key] = k``."""
        holders = set(self.kernels)
        changed = True
        while changed:
            changed = False
            for node in ast.walk(self.tree):
                if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
                    continue
                if not any(self._holds_kernel(n, holders) for n in ast.walk(node.value)):
                    continue
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in flatten_targets(list(targets)):
                    key = holder_key(target)
                    if key and key not in holders:
                        holders.add(key)
                        changed = True
        return holders

    @staticmethod
    def _holds_kernel(node: ast.AST, holders: set[str]) -> bool:
        if isinstance(node, ast.Name):
            return node.id in holders
        return is_self_attribute(node) and (
            "self." + node.attr in holders or node.attr in holders  # type: ignore[union-attr]
        )

    def launches_kernel(self, call: ast.Call) -> bool:
        """``k[grid](...)``, ``TABLE[dtype][grid](...)``, ``self._k[key][grid](...)``,
        ``k.run(...)`` where ``k`` holds a kernel, and any of these through ``wrap_triton(k)``
        (PyTorch's wrapper for a Triton kernel inside a ``triton_op``: in eager mode it launches
        ``k``)."""
        func = call.func
        if isinstance(func, ast.Subscript):
            target: ast.AST = func.value
        elif isinstance(func, ast.Attribute) and func.attr in ("run", "warmup"):
            target = func.value
        else:
            return False
        while isinstance(target, ast.Subscript) or (
            isinstance(target, ast.Call)
            and target.args
            and self.resolve(target.func) in TRITON_WRAPPERS
        ):
            target = target.value if isinstance(target, ast.Subscript) else target.args[0]  # type: ignore[attr-defined]
        return self._holds_kernel(target, self.kernel_holders)

    def is_extension(self, owner: ast.AST) -> bool:
        """``ext``, ``self.ext`` or ``load_ext()``: an object whose methods are the solution's
        compiled CUDA functions."""
        if isinstance(owner, ast.Name):
            return owner.id in self.extension_names
        if is_self_attribute(owner):
            return owner.attr in self.extension_names  # type: ignore[union-attr]
        return (
            isinstance(owner, ast.Call)
            and isinstance(owner.func, ast.Name)
            and owner.func.id in self.loader_functions
        )

    def receiver(self, owner: ast.AST) -> str:
        """What a method is called on: ``module``, ``solution`` (the solution's own functions,
        classes, instances, kernels, extension), ``layer``, ``container`` or ``unknown`` (maybe
        a tensor)."""
        if self.resolve(owner):
            return "module"
        if self.layer_of(owner):
            return "layer"
        if isinstance(owner, ast.Name):
            if owner.id in ("self", "cls") or owner.id in self.instances:
                return "solution"
            if owner.id in self.functions or owner.id in self.classes:
                return "solution"
            if owner.id in self.kernel_holders or owner.id in self.extension_names:
                return "solution"
            if owner.id in self.containers:
                return "container"
        if is_self_attribute(owner):
            attr = owner.attr  # type: ignore[union-attr]
            if self.attribute_types.get(attr) in self.classes or attr in self.extension_names:
                return "solution"
            if "self." + attr in self.containers:
                return "container"
        if isinstance(owner, ast.Call):
            func = owner.func
            if isinstance(func, ast.Name) and func.id in ("super", *self.classes):
                return "solution"
            if self.is_extension(owner):
                return "solution"
        if isinstance(owner, ast.Constant | ast.JoinedStr | ast.Dict | ast.List | ast.Set):
            return "container"
        return "unknown"

    def _hooks(self) -> list[ast.AST]:
        """Functions registered as forward hooks: they run on every call like forward."""
        hooks = []
        for node in ast.walk(self.tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _HOOK_REGISTRARS
            ):
                for argument in node.args:
                    hooks.extend(self._referenced(argument))
                    if isinstance(argument, ast.Lambda):
                        hooks.append(argument)
        return hooks

    def referenced(self, node: ast.AST) -> list[ast.AST]:
        """The solution's functions and methods that ``node`` names (aliases followed)."""
        return list(self._referenced(node))

    def _referenced(self, node: ast.AST) -> Iterator[ast.AST]:
        """Solution functions/methods an expression names (calls, callbacks, tables); an op
        the solution registered brings every implementation registered for it."""
        for found in self._referenced_directly(node):
            yield found
            yield from self.op_impls.get(id(found), [])

    def _referenced_directly(self, node: ast.AST, follow_aliases: bool = True) -> Iterator[ast.AST]:
        key = holder_key(node) if isinstance(node, ast.Name | ast.Attribute) else None
        if follow_aliases and key:
            for value in self.callable_aliases.get(key, []):
                yield from self._referenced_directly(value, follow_aliases=False)
        if isinstance(node, ast.Name):
            if node.id in self.functions:
                yield self.functions[node.id]
            elif node.id in self.classes:
                for method in ("__init__", "forward", "__call__"):
                    found = self.method(node.id, method)
                    if found:
                        yield found
        elif isinstance(node, ast.Attribute):
            registered = self.own_op(self.resolve(node))
            if registered is not None:  # torch.ops.ns.name: the solution's registered op
                yield registered
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in self.classes:
                found = self.method(owner.id, "forward")  # MyFunction.apply -> forward
                if found:
                    yield found
            if is_self_attribute(node) and self.attribute_types.get(node.attr) in self.classes:
                for method in ("forward", "__call__"):
                    found = self.method(self.attribute_types[node.attr], method)
                    if found:
                        yield found
            yield from self.methods.get(node.attr, [])

    def _reachable(self, roots: list[ast.AST]) -> list[ast.AST]:
        seen: dict[int, ast.AST] = {id(r): r for r in roots}
        queue = list(roots)
        while queue:
            fn = queue.pop()
            for node in walk_skipping(fn, self.kernel_defs):
                if isinstance(node, ast.Name | ast.Attribute) and isinstance(node.ctx, ast.Load):
                    for callee in self._referenced(node):
                        if id(callee) not in seen and callee not in self.kernel_defs:
                            seen[id(callee)] = callee
                            queue.append(callee)
        return list(seen.values())

    def _compute_path(self) -> list[ast.AST]:
        """Everything that may run outside construction: the code reachable from any function,
        method or lambda of the solution, from its module level, class bodies and decorators
        (run at import), except what only ``__init__`` reaches. Construction is audited at run
        time (``init_compute``); everything else is where torch compute would hide from the
        forward path (hooks, heuristics, dunders, helpers reached by a path not seen here)."""
        inits = [item for item in self.methods.get("__init__", [])]
        init_only = {id(fn) for fn in self._reachable(inits)}
        functions = [
            node
            for node in ast.walk(self.tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            and node not in self.kernel_defs
            and id(node) not in init_only
        ]
        return self._reachable([self.import_time_code(), *functions])

    def import_time_code(self) -> ast.Module:
        """Statements that run when the module is imported: module level and class bodies
        (not the functions they define), and every decorator expression."""
        body: list[ast.stmt] = []
        pending: list[ast.stmt] = list(self.tree.body)
        while pending:
            statement = pending.pop()
            if isinstance(statement, ast.ClassDef):
                body.extend(ast.Expr(value=d) for d in statement.decorator_list)
                pending.extend(statement.body)
            elif isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
                body.extend(ast.Expr(value=d) for d in statement.decorator_list)
            else:
                body.append(statement)
        return ast.Module(body=body, type_ignores=[])

    def compute_nodes(self) -> Iterator[ast.AST]:
        yield from self._nodes(self.compute_path)

    def forward_nodes(self) -> Iterator[ast.AST]:
        yield from self._nodes(self.forward_path)

    def _nodes(self, functions: list[ast.AST]) -> Iterator[ast.AST]:
        seen: set[int] = set()
        for fn in functions:
            for node in walk_skipping(fn, self.kernel_defs):
                if id(node) not in seen:
                    seen.add(id(node))
                    yield node


def _alias_closure(aliases: dict[str, list[ast.AST]]) -> dict[str, list[ast.AST]]:
    """For every alias, the values it stands for at the end of its chains (``a = b``, ``b = f``
    gives ``a -> f``), each found once: following chains per reference instead would take
    time exponential in a submission's length."""
    closure: dict[str, list[ast.AST]] = {}
    for start in aliases:
        seen, queue, ends = {start}, list(aliases[start]), []
        while queue:
            value = queue.pop()
            key = holder_key(value) if isinstance(value, ast.Name | ast.Attribute) else None
            if key in aliases:
                if key not in seen:
                    seen.add(key)
                    queue.extend(aliases[key])
            else:
                ends.append(value)
            if key in aliases and not isinstance(value, ast.Name):
                ends.append(value)  # an attribute alias (Fn.apply) is itself a reference
        closure[start] = ends
    return closure
