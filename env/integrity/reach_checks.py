"""Static checks on what a solution reaches beyond its kernel: another compiler, patched
modules, forbidden modules and builtins, introspection, side streams (deny-lists in
``forbidden``), torch's process-wide state (a class: ``global_state``)."""

from __future__ import annotations

import ast

from kernelrl.env.backends import BACKENDS, get_backend
from kernelrl.env.integrity.analysis import SolutionAnalysis
from kernelrl.env.integrity.failure import CheckFailure, dedup
from kernelrl.env.integrity.forbidden import (
    ALLOWED_DUNDERS,
    CUDA_COPY_CALL,
    CUDA_COPY_DIRECTIONS,
    DISPATCH_HOOKS,
    DISPATCH_MODULES,
    DYNAMIC_LOOKUP_CALLS,
    FORBIDDEN_BUILTINS,
    FORBIDDEN_MODULES,
    FORBIDDEN_TORCH_APIS,
    HOST_ACCESS_CUDA,
    INTROSPECTION_ATTRIBUTES,
    NAME_TAKING_BUILTINS,
    OS_ALLOWED,
    OTHER_COMPILER_MODULES,
    OTHER_COMPILER_PREFIXES,
    REEXPORTED_FORBIDDEN,
    SIDE_STREAM_CALLS,
    SIDE_STREAM_CUDA,
)
from kernelrl.env.integrity.global_state import global_state_change
from kernelrl.env.integrity.names import flatten_targets, module_of, parent_map
from kernelrl.env.parse import cpp_extension_sources, strip_c_comments


def check_other_compiler(analysis: SolutionAnalysis, ref_ops: set[str]) -> list[CheckFailure]:
    failures = []
    for node in ast.walk(analysis.tree):
        names: list[tuple[str, int]] = []
        if isinstance(node, ast.Import):
            names = [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [(f"{node.module}.{alias.name}", node.lineno) for alias in node.names]
        elif isinstance(node, ast.Attribute | ast.Name | ast.Call) and isinstance(
            getattr(node, "ctx", ast.Load()), ast.Load
        ):
            resolved = analysis.resolve(node)
            if resolved:
                names = [(resolved, node.lineno)]
        for name, lineno in names:
            if module_of(name) in OTHER_COMPILER_MODULES or any(
                name == p or name.startswith(p + ".") for p in OTHER_COMPILER_PREFIXES
            ):
                failures.append(
                    CheckFailure(
                        "other_compiler",
                        f"{name} stands in for a hand-written kernel; write the kernel yourself.",
                        lineno,
                    )
                )
    asked = get_backend(analysis.backend)
    for other in BACKENDS.values():
        if other is asked or not other.used_by(analysis.tree, analysis.aliases):
            continue
        failures.append(
            CheckFailure(
                "other_compiler",
                f"this task asks for {asked.display_name} kernels ({asked.kernel_form}), but the "
                f"solution uses {other.display_name} ({other.kernel_form}).",
            )
        )
    return dedup(failures)


def check_monkeypatch(analysis: SolutionAnalysis, ref_ops: set[str]) -> list[CheckFailure]:
    failures = []

    def patched(target: ast.AST) -> bool:
        if isinstance(target, ast.Name):
            return target.id in ("__builtins__", "Model")
        if not isinstance(target, ast.Attribute | ast.Subscript):
            return False
        owner = target.value
        while isinstance(owner, ast.Attribute | ast.Subscript):
            if analysis.resolve(owner):
                return True
            owner = owner.value
        if isinstance(owner, ast.Name) and owner.id in ("Model", "__builtins__"):
            return True
        return analysis.resolve(owner) is not None

    for node in ast.walk(analysis.tree):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "delattr")
            and node.args
        ):
            targets = [ast.Attribute(value=node.args[0], attr="?", ctx=ast.Store())]
        for target in flatten_targets(targets):
            if patched(target):
                what = ast.unparse(target).replace(".?", "")
                failures.append(
                    CheckFailure(
                        "monkeypatch",
                        f"the solution modifies {what}; it must not patch torch, builtins, "
                        "timers or the harness.",
                        node.lineno,
                    )
                )
        if isinstance(node, ast.Call):
            resolved = analysis.resolve(node.func) or ""
            if resolved.startswith("torch.library") and any(
                isinstance(c, ast.Constant)
                and isinstance(c.value, str)
                and c.value.startswith("aten")
                for c in ast.walk(node)
            ):
                failures.append(
                    CheckFailure(
                        "monkeypatch",
                        "torch.library is used to override an aten operator.",
                        node.lineno,
                    )
                )
        if isinstance(node, ast.FunctionDef) and node.name in DISPATCH_HOOKS:
            failures.append(
                CheckFailure(
                    "monkeypatch",
                    f"{node.name} intercepts torch calls; it is not allowed.",
                    node.lineno,
                )
            )
        if isinstance(node, ast.Attribute | ast.Name):
            resolved = analysis.resolve(node)
            if resolved and resolved.startswith(DISPATCH_MODULES):
                failures.append(
                    CheckFailure(
                        "monkeypatch",
                        f"{resolved} intercepts torch calls; it is not allowed.",
                        node.lineno,
                    )
                )
    return dedup(failures)


def _reexported(resolved: str) -> str | None:
    """``torch.os.system`` -> ``torch.os``: a forbidden module reached as another module's
    attribute (``torch.select`` is torch's own op, not the ``select`` module)."""
    parts = resolved.split(".")
    for i, part in enumerate(parts[1:], 1):
        if part in REEXPORTED_FORBIDDEN:
            if part == "select" and i == len(parts) - 1:
                continue
            return ".".join(parts[: i + 1])
    return None


def check_forbidden_module(analysis: SolutionAnalysis, ref_ops: set[str]) -> list[CheckFailure]:
    failures = []

    def fail(what: str, lineno: int) -> None:
        failures.append(
            CheckFailure(
                "forbidden_module",
                f"{what} is not allowed in a solution (threads, processes, raw memory, I/O, "
                "timers, introspection, profilers).",
                lineno,
            )
        )

    for node in ast.walk(analysis.tree):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            modules = [base] + [f"{base}.{alias.name}" for alias in node.names]
            if node.module == "os" and not node.level:
                modules = [f"os.{alias.name}" for alias in node.names]
        for module in modules:
            if (
                module.startswith(".")
                or module_of(module) in FORBIDDEN_MODULES
                or (module.startswith("os.") and module not in OS_ALLOWED)
                or module.startswith(FORBIDDEN_TORCH_APIS)
                or _reexported(module)
            ):
                fail(f"import of {module.lstrip('.') or 'a relative module'}", node.lineno)
                break
        if isinstance(node, ast.Attribute | ast.Call) and isinstance(
            getattr(node, "ctx", ast.Load()), ast.Load
        ):
            resolved = analysis.resolve(node)
            if not resolved:
                continue
            if (
                module_of(resolved) in FORBIDDEN_MODULES
                and not isinstance(node, ast.Name)
                or (
                    module_of(resolved) == "os"
                    and resolved.count(".") >= 1
                    and ".".join(resolved.split(".")[:2]) not in OS_ALLOWED
                )
                or resolved.startswith(FORBIDDEN_TORCH_APIS)
            ):
                fail(resolved, node.lineno)
            elif _reexported(resolved):
                fail(f"{_reexported(resolved)} (a module reached through another)", node.lineno)
    return dedup(failures)


def check_forbidden_builtin(analysis: SolutionAnalysis, ref_ops: set[str]) -> list[CheckFailure]:
    failures = []
    defined = set(analysis.functions) | set(analysis.classes) | set(analysis.aliases)

    def fail(message: str, node: ast.AST) -> None:
        failures.append(CheckFailure("forbidden_builtin", message, getattr(node, "lineno", None)))

    for node in ast.walk(analysis.tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if node.id in FORBIDDEN_BUILTINS and node.id not in defined:
                fail(f"the builtin {node.id} is not allowed in a solution.", node)
            elif node.id.startswith("__") and node.id not in ("__name__", "__file__"):
                fail(f"{node.id} is not allowed in a solution.", node)
        elif isinstance(node, ast.Attribute):
            if _is_introspection(node.attr):
                fail(f"introspection through .{node.attr} is not allowed in a solution.", node)
        elif isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else None
            if name in NAME_TAKING_BUILTINS and name not in defined:
                attr = analysis.names.const(node.args[1]) if len(node.args) >= 2 else None
                owner = node.args[0] if node.args else None
                on_self = isinstance(owner, ast.Name) and owner.id == "self"
                if attr is None and not (on_self and name in ("getattr", "hasattr")):
                    fail(
                        f"{name}() with a name that is not a constant hides what is accessed "
                        "(a dynamic lookup); use plain attribute access.",
                        node,
                    )
                elif attr is not None and _is_introspection(attr):
                    fail(f"introspection through {name}(..., {attr!r}) is not allowed.", node)
            elif analysis.resolve(node.func) in DYNAMIC_LOOKUP_CALLS:
                fail(f"{analysis.resolve(node.func)} is a dynamic attribute lookup.", node)
    return dedup(failures)


def _is_introspection(attr: str) -> bool:
    dunder = attr.startswith("__") and attr.endswith("__") and attr not in ALLOWED_DUNDERS
    return dunder or attr in INTROSPECTION_ATTRIBUTES


def check_side_stream(analysis: SolutionAnalysis, ref_ops: set[str]) -> list[CheckFailure]:
    failures = []
    for node in ast.walk(analysis.tree):
        if isinstance(node, ast.Attribute | ast.Name | ast.Call) and isinstance(
            getattr(node, "ctx", ast.Load()), ast.Load
        ):
            resolved = analysis.resolve(node)
            if resolved in SIDE_STREAM_CALLS:
                failures.append(
                    CheckFailure(
                        "side_stream",
                        f"{resolved}: work must run on the current stream, where the harness "
                        "times it.",
                        node.lineno,
                    )
                )
    for _, sources in cpp_extension_sources(analysis.tree, analysis.names.imports):
        for fragments in sources.values():
            for text, lineno in fragments:
                match = SIDE_STREAM_CUDA.search(strip_c_comments(text))
                if match:
                    failures.append(
                        CheckFailure(
                            "side_stream",
                            f"{match.group(1)} in the CUDA source: launch on "
                            "at::cuda::getCurrentCUDAStream().",
                            lineno,
                        )
                    )
    return dedup(failures)


def check_global_state(analysis: SolutionAnalysis, ref_ops: set[str]) -> list[CheckFailure]:
    """Anywhere in the module, a reference (a call, a write, a value) to something that changes
    torch's process-wide state (``global_state.global_state_change``), said as what it is."""
    failures = []
    parents = parent_map(analysis.tree)
    for node in ast.walk(analysis.tree):
        if not isinstance(node, ast.Attribute | ast.Name | ast.Call):
            continue
        parent = parents.get(id(node))
        if isinstance(parent, ast.Attribute) and parent.value is node:
            continue  # only the whole chain is judged
        changed = global_state_change(analysis.resolve(node))
        if changed:
            failures.append(
                CheckFailure(
                    "global_state",
                    f"{changed} changes torch's process-wide state (defaults, backend flags, "
                    "deterministic algorithms, denormal flushing); the sandbox makes the inputs "
                    "and reads the outputs under that state, so a solution must leave it as it "
                    "is.",
                    node.lineno,
                )
            )
    return dedup(failures)


def check_host_compute(analysis: SolutionAnalysis, ref_ops: set[str]) -> list[CheckFailure]:
    """Host code that reaches device data in a compiled extension's source (``HOST_ACCESS_CUDA``;
    a memory copy whose direction is not named as host-to-device or device-to-device), and in a
    CUDA solution's Python a tensor moved to or made on the host (``.cpu()``, ``"cpu"``,
    ``pin_memory``), which only host code in the extension could compute on."""
    failures = []

    def fail(what: str, lineno: int | None) -> None:
        failures.append(
            CheckFailure(
                "host_compute",
                f"{what}: the work must be done on the GPU by your kernels; host code that "
                "reads device data (copies to the host, pinned, mapped or managed memory, CPU "
                "tensors) computes where no check looks.",
                lineno,
            )
        )

    for _, sources in cpp_extension_sources(analysis.tree, analysis.names.imports):
        for fragments in sources.values():
            for text, lineno in fragments:
                code = strip_c_comments(text)
                match = HOST_ACCESS_CUDA.search(code)
                if match:
                    fail(f"{match.group(0)} in the CUDA source", lineno)
                for call in CUDA_COPY_CALL.finditer(code):
                    arguments = _call_arguments(code, call.end())
                    named = any(d in arguments for d in CUDA_COPY_DIRECTIONS)
                    if not named and not HOST_ACCESS_CUDA.search(arguments):  # not said above
                        fail(f"{call.group(1)} without a named host-to-device direction", lineno)
    if analysis.backend == "cuda":
        for node in ast.walk(analysis.tree):
            if isinstance(node, ast.Attribute) and node.attr in ("cpu", "pin_memory"):
                fail(f".{node.attr} in a CUDA solution", node.lineno)
            elif isinstance(node, ast.keyword) and node.arg == "pin_memory":
                fail("pin_memory in a CUDA solution", node.value.lineno)
            elif isinstance(node, ast.Constant) and str(node.value).split(":")[0] == "cpu":
                fail('the device "cpu" in a CUDA solution', node.lineno)
    return dedup(failures)


def _call_arguments(code: str, start: int) -> str:
    """The text of a call's arguments, from just after its ``(`` to the matching ``)``."""
    depth = 1
    for index in range(start, len(code)):
        depth += {"(": 1, ")": -1}.get(code[index], 0)
        if depth == 0:
            return code[start:index]
    return code[start:]
