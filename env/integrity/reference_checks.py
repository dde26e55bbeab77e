"""``unlisted_reference``: every name, attribute chain and builtin in the whole solution module
resolves to something on the allow-list (``allowed``), or the solution is rejected.

Scoping comes from Python's own compiler (``symtable``), so a name is a builtin exactly when
Python would look it up among the builtins. Attribute chains rooted at an imported module are
judged by what they reach (``allowed.module_rule``); attributes of values whose type is unknown
must be public names of the values a solution works with, or names the solution itself defines
(public ones anywhere; underscored ones only on its own ``self``). A module itself is never a
value (it could be stored and read back where no chain shows it). Kernel bodies are checked too:
under the CPU interpreter they run as Python.
"""

from __future__ import annotations

import ast
import builtins
import symtable
from collections.abc import Iterator

from kernelrl.env.integrity import allowed
from kernelrl.env.integrity.analysis import SolutionAnalysis
from kernelrl.env.integrity.failure import CheckFailure, dedup

NAME = "unlisted_reference"
# A public attribute name that no value a solution works with has, and that the solution does
# not define: most likely a mistaken API (``x.stride_bytes``), so it is said as an error in the
# solution, not as a hack; it never runs either way.
UNKNOWN_API = "unknown_api"
# A name looked up among the builtins that Python's builtins do not have and the solution never
# binds (``r1`` for ``x1``): a NameError when it runs, an honest mistake, so also said as an
# error in the solution; it never runs either way. Dunder names stay ``unlisted_reference``
# (``__builtins__``, ``__loader__``: the module's own namespace, not a typo), and any other
# failure beside it (a ``globals()`` that could bind it) keeps the verdict a violation.
UNDEFINED_NAME = "undefined_name"


def check_unlisted_reference(analysis: SolutionAnalysis, ref_ops: set[str]) -> list[CheckFailure]:
    checker = _ReferenceChecker(analysis)
    checker.run()
    return dedup(checker.failures)


class _ReferenceChecker:
    def __init__(self, analysis: SolutionAnalysis) -> None:
        self.analysis = analysis
        self.tree = analysis.tree
        self.failures: list[CheckFailure] = []
        self.own_public, self.own_private = self._own_attribute_names()
        self.receivers = self._self_names()
        self.own_typed = self._own_typed_names()
        self.attribute_bases = {
            id(node.value) for node in ast.walk(self.tree) if isinstance(node, ast.Attribute)
        }
        self.called = {id(node.func) for node in ast.walk(self.tree) if isinstance(node, ast.Call)}
        self.decorators = {
            id(decorator)
            for node in ast.walk(self.tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            for decorator in node.decorator_list
        }

    def fail(self, node: ast.AST, message: str, name: str = NAME) -> None:
        self.failures.append(
            CheckFailure(
                name,
                f"{message}. A solution may reference only torch, triton and its own code "
                "(see the allow-list); reflection and the harness are out of reach.",
                getattr(node, "lineno", None),
            )
        )

    def run(self) -> None:
        self._check_builtins()
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                self._check_import(node)
            elif isinstance(node, ast.Attribute):
                self._check_attribute(node)
                if isinstance(getattr(node, "ctx", None), ast.Store | ast.Del):
                    self._check_attribute_write(node)
            elif isinstance(node, ast.Name):
                self._check_name_use(node)
            elif isinstance(node, ast.ClassDef):
                self._check_class(node)
            elif isinstance(node, ast.Call):
                self._check_call(node)
            elif isinstance(node, ast.Match):
                self.fail(node, "match statements are not on the allow-list")

    # ------------------------------------------------------------------ names and builtins
    def _check_builtins(self) -> None:
        """Names Python resolves among the builtins must be listed, and module- or class-level
        names may not rebind a builtin that is not (the binding may not have run)."""
        try:
            table = symtable.symtable(ast.unparse(self.tree), "<solution>", "exec")
        except SyntaxError:
            return
        module_bound = {s.get_name() for s in table.get_symbols() if _binds(s)}
        shadowable = allowed.shadowable_builtins()
        for scope in _tables(table):
            top_level = scope.get_type() in ("module", "class")
            for symbol in scope.get_symbols():
                name = symbol.get_name()
                if top_level and _binds(symbol) and name in shadowable:
                    self.fail(self.tree, f"the name {name!r} rebinds a builtin")
                if not symbol.is_referenced() or name in allowed.BUILTINS:
                    continue
                looked_up_globally = symbol.is_global() or scope.get_type() == "module"
                if not looked_up_globally or name in module_bound:
                    continue
                if _is_dunder(name) or hasattr(builtins, name):
                    self.fail(self._first_use(name), f"the builtin {name!r} is not on the list")
                else:
                    self.failures.append(
                        CheckFailure(
                            UNDEFINED_NAME,
                            f"name {name!r} is not defined (a NameError when the code runs): "
                            "define it before use or use the name you meant.",
                            getattr(self._first_use(name), "lineno", None),
                        )
                    )

    def _first_use(self, name: str) -> ast.AST:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Name) and node.id == name:
                return node
        return self.tree

    def _check_hook_taker_as_value(self, node: ast.expr) -> None:
        """A callable with hook parameters is only called directly (or used as a decorator):
        handed to ``functools.partial`` or ``map`` its positional arguments would be read
        against another signature."""
        if (
            id(node) in self.called
            or id(node) in self.attribute_bases
            or id(node) in self.decorators
        ):
            return
        qualified = self.analysis.resolve(node)
        if qualified and allowed.hook_parameters(qualified):
            self.fail(node, f"{qualified} takes hooks; it may only be called directly")

    def _check_name_use(self, node: ast.Name) -> None:
        if not isinstance(node.ctx, ast.Load):
            return
        self._check_hook_taker_as_value(node)
        if node.id in allowed.NAME_TAKING_BUILTINS and id(node) not in self.called:
            self.fail(node, f"{node.id} may only be called with a constant name")
            return
        self._check_module_as_value(node)

    def _check_module_as_value(self, node: ast.expr) -> None:
        qualified = self.analysis.resolve(node)
        if qualified and allowed.is_module_path(qualified) and id(node) not in self.attribute_bases:
            self.fail(node, f"the module {qualified} is used as a value")

    # ------------------------------------------------------------------ imports
    def _check_import(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                self.fail(node, "relative imports are not on the allow-list")
                return
            targets = [f"{node.module}.{alias.name}" for alias in node.names]
            if any(alias.name == "*" for alias in node.names):
                self.fail(node, f"'from {node.module} import *' is not on the allow-list")
                return
        else:
            targets = [alias.name for alias in node.names]
        for target in targets:
            if allowed.is_module_path(target):
                continue
            what, why = allowed.module_rule(target)
            if what:
                self.fail(node, f"import of {target}: {why}")

    # ------------------------------------------------------------------ attributes
    def _check_attribute(self, node: ast.Attribute) -> None:
        if isinstance(getattr(node, "ctx", None), ast.Load):
            self._check_hook_taker_as_value(node)
        qualified = self.analysis.resolve(node.value)
        if qualified is not None and allowed.is_module_path(qualified):
            what, why = allowed.module_rule(f"{qualified}.{node.attr}")
            if what:
                self.fail(node, f"{what}: {why}")
            elif id(node) not in self.attribute_bases:
                self._check_module_as_value(node)
            return
        if qualified is not None and qualified.split(".")[0] in _ROOTS:
            what, why = allowed.module_rule(f"{qualified}.{node.attr}")
            if what:
                self.fail(node, f"{what}: {why}")
            return
        self._check_value_attribute(node, node.value, node.attr)

    def _check_value_attribute(self, node: ast.AST, receiver: ast.AST, attr: str) -> None:
        """An attribute of a value whose type the checker does not know."""
        if attr in allowed.DENIED_MEMBERS:
            self.fail(node, f"the attribute {attr!r} is not on the allow-list")
        elif attr.startswith("__") and attr.endswith("__"):
            if attr not in allowed.READABLE_DUNDERS:
                self.fail(node, f"the attribute {attr!r} is introspection")
        elif attr.startswith("_"):
            if not self._is_receiver(receiver) or attr not in self.own_private:
                self.fail(node, f"the private attribute {attr!r} is not the solution's own")
        elif attr == "format":
            self._check_format(node, receiver)
        elif (
            attr not in allowed.value_attributes()
            and attr not in self.own_public
            and not self._is_receiver(receiver)
            and not self._extension_attribute(receiver)
        ):
            self.fail(node, f"no tensor, module or Triton value has {attr!r}", UNKNOWN_API)

    def _is_receiver(self, node: ast.AST) -> bool:
        """The solution's own object (``self``): its public attributes are its module's members
        or what the solution set, whatever their names."""
        return isinstance(node, ast.Name) and node.id in self.receivers

    def _check_format(self, node: ast.AST, receiver: ast.AST) -> None:
        """``str.format`` reads attributes named in its fields: only constant formats whose
        fields name no attribute or item."""
        if not (isinstance(receiver, ast.Constant) and isinstance(receiver.value, str)):
            self.fail(node, "str.format on a string that is not a constant")
            return
        if any("." in f or "[" in f for f in allowed.format_fields(receiver.value)):
            self.fail(node, "a format field reads an attribute or an item")

    def _extension_attribute(self, receiver: ast.AST) -> bool:
        """Functions of the solution's own compiled extension (``load_inline``)."""
        names = self.analysis.extension_names
        if isinstance(receiver, ast.Name):
            return receiver.id in names
        if isinstance(receiver, ast.Attribute) and isinstance(receiver.value, ast.Name):
            return receiver.value.id in self.receivers and receiver.attr in names
        return (
            isinstance(receiver, ast.Call)
            and isinstance(receiver.func, ast.Name)
            and (receiver.func.id in self.analysis.loader_functions)
        )

    def _check_attribute_write(self, node: ast.Attribute) -> None:
        """No attribute that Triton's kernel objects or torch.library's ops hold code in
        (``fn``, ``run``, ``cache``, ``configs``...: ``allowed.library_object_attributes``) is
        written on anything but the solution's own object: ``kernel.fn = body`` makes a launch
        run ``body`` (under the CPU interpreter, as Python), however the kernel was reached (a
        parameter, a loop variable, ``self.kernel``). Writes on modules and torch classes are
        ``monkeypatch``'s; other attributes are the solution's business."""
        if node.attr not in allowed.library_object_attributes():
            return
        owner = node.value
        if isinstance(owner, ast.Name) and (
            owner.id in self.receivers
            or owner.id in self.own_typed
            or owner.id in self.analysis.classes
        ):
            return
        if self.analysis.resolve(owner):
            return  # torch, triton or another module: ``monkeypatch`` says so
        self.fail(
            node,
            f"the attribute {node.attr!r} is written on {ast.unparse(owner)}: Triton's kernels "
            "and torch.library's ops hold code in it",
        )

    def _own_typed_names(self) -> set[str]:
        """Names bound to instances of the solution's classes: ``plan = Plan()``, or a
        parameter annotated with one of them (``def tune(cfg: KernelCfg)``)."""
        names = set(self.analysis.instances)
        for node in ast.walk(self.tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                arguments = node.args
                for arg in arguments.posonlyargs + arguments.args + arguments.kwonlyargs:
                    annotation = getattr(arg, "annotation", None)
                    if isinstance(annotation, ast.Name) and annotation.id in self.analysis.classes:
                        names.add(arg.arg)
        return names

    # ------------------------------------------------------------------ calls and classes
    def _check_call(self, node: ast.Call) -> None:
        for keyword in node.keywords:
            if keyword.arg in allowed.HOOK_KEYWORDS:
                self.fail(keyword.value, f"the keyword {keyword.arg!r} hands over a hook")
        qualified = self.analysis.resolve(node.func)
        hooks = allowed.hook_parameters(qualified) if qualified else ()
        if hooks:
            # A hook handed over by position or through ``*``/``**`` unpacking is still a hook.
            unpacked = [k.value for k in node.keywords if k.arg is None]
            if any(isinstance(a, ast.Starred) for a in node.args) or any(
                not self._known_options(value) for value in unpacked
            ):
                self.fail(node, f"{qualified} takes hooks; its arguments may not be unpacked")
            for hook, position in hooks:
                if position < len(node.args):
                    self.fail(node.args[position], f"the argument {hook!r} hands over a hook")
        func = node.func
        if isinstance(func, ast.Name) and func.id in allowed.NAME_TAKING_BUILTINS:
            name = self.analysis.names.const(node.args[1]) if len(node.args) >= 2 else None
            if name is None:
                self.fail(node, f"{func.id} with a name that is not a constant")
            else:
                self._check_attribute(
                    ast.Attribute(value=node.args[0], attr=name, lineno=node.lineno)
                )

    def _known_options(self, value: ast.AST) -> bool:
        """``**options`` whose keys are known and none a hook: a dict literal with constant
        keys, or a module-level name bound once to one and used nowhere else (no item set, no
        method called, no parameter of that name: nothing can change it)."""
        if isinstance(value, ast.Name):
            value = self._constant_dict(value.id) or value
        if not isinstance(value, ast.Dict):
            return False
        keys = [k.value if isinstance(k, ast.Constant) else None for k in value.keys]
        return all(isinstance(k, str) and k not in allowed.HOOK_KEYWORDS for k in keys)

    def _constant_dict(self, name: str) -> ast.Dict | None:
        bound = [
            node.value
            for node in self.tree.body
            if isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == name
        ]
        if len(bound) != 1 or not isinstance(bound[0], ast.Dict):
            return None
        unpacked = {
            id(k.value)
            for n in ast.walk(self.tree)
            if isinstance(n, ast.Call)
            for k in n.keywords
            if k.arg is None
        }
        for node in ast.walk(self.tree):
            if isinstance(node, ast.arg) and node.arg == name:
                return None
            if isinstance(node, ast.Name) and node.id == name:
                stored = not isinstance(node.ctx, ast.Load)
                if (stored and node is not self._module_target(name)) or (
                    not stored and id(node) not in unpacked
                ):
                    return None
        return bound[0]

    def _module_target(self, name: str) -> ast.AST | None:
        for node in self.tree.body:
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == name
            ):
                return node.targets[0]
        return None

    def _check_class(self, node: ast.ClassDef) -> None:
        if node.keywords:
            self.fail(node, "class keywords (a metaclass) are not on the allow-list")
        for base in node.bases:
            own = isinstance(base, ast.Name) and base.id in self.analysis.classes
            qualified = self.analysis.resolve(base) or (
                base.id if isinstance(base, ast.Name) else None
            )
            if not own and qualified not in allowed.BASE_CLASSES:
                self.fail(base, f"a class may not derive from {ast.unparse(base)}")
        for item in node.body:
            if (
                isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                and item.name.startswith("__")
                and item.name.endswith("__")
                and item.name not in allowed.DEFINABLE_DUNDERS
            ):
                self.fail(item, f"a class may not define {item.name}")

    # ------------------------------------------------------------------ the solution's own names
    def _own_attribute_names(self) -> tuple[set[str], set[str]]:
        """Attribute names the solution defines: assigned on an object, or defined in its classes
        (methods, class attributes), and keyword names of its own functions' results."""
        names: set[str] = set()
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                        names.add(item.name)
                    for target in _assigned_names(item):
                        names.add(target)
        private = {n for n in names if n.startswith("_") and n not in allowed.private_members()}
        return {n for n in names if not n.startswith("_")}, private

    def _self_names(self) -> set[str]:
        """The first parameter of every method: the receiver whose own private attributes the
        solution may use."""
        names = {"self"}
        for cls in self.analysis.classes.values():
            for item in cls.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.args.args:
                    names.add(item.args.args[0].arg)
        return names


_ROOTS = frozenset(name.split(".")[0] for name in allowed.MODULE_MEMBERS)


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _binds(symbol: symtable.Symbol) -> bool:
    return symbol.is_assigned() or symbol.is_imported() or symbol.is_namespace()


def _tables(table: symtable.SymbolTable) -> Iterator[symtable.SymbolTable]:
    yield table
    for child in table.get_children():
        yield from _tables(child)


def _assigned_names(node: ast.AST) -> Iterator[str]:
    if isinstance(node, ast.Assign):
        for target in node.targets:
            if isinstance(target, ast.Name):
                yield target.id
    elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        yield node.target.id
