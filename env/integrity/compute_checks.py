"""Static checks that torch is not standing in for the kernel.

``no_custom_kernel``: a kernel of the task's backend is defined and launched on the forward path.
``torch_fallback``: the forward path calls or references no torch compute (anything outside the
glue vocabulary), no ``nn`` layer, ``@``, reference ``Model`` or numpy, and no copying glue op
that the reference itself uses. ``try_except_fallback``: no ``except`` handler computes with
torch, numpy or the reference ``Model``.
"""

from __future__ import annotations

import ast
import builtins

from kernelrl.env.backends import get_backend
from kernelrl.env.integrity.analysis import SolutionAnalysis
from kernelrl.env.integrity.failure import CheckFailure
from kernelrl.env.integrity.names import (
    bindings,
    flatten_targets,
    holder_key,
    is_self_attribute,
    module_of,
    parent_map,
)
from kernelrl.env.integrity.vocabulary import (
    COPYING_TORCH_OPS,
    GLUE_TORCH_OPS,
    METADATA_OPS,
    MOVEMENT_OPS,
    is_glue_method,
    is_glue_torch,
    is_passive_layer,
    is_torch_value,
    torch_op_name,
)

# Methods of Python's own containers and strings: on an object of unknown type they are not
# tensor compute. Four names are tensor ops too, so they count only on a known container.
_PY_METHODS = frozenset(
    m
    for t in (dict, list, set, frozenset, str, bytes, tuple, int, float)
    for m in dir(t)
    if not m.startswith("_")
)
_TENSOR_ALSO = frozenset({"add", "index", "sort", "values"})
# nn.Module plumbing that is safe to call on a layer object.
_MODULE_PLUMBING = frozenset(
    {"parameters", "named_parameters", "buffers", "named_buffers", "modules", "children"}
    | {"state_dict", "to", "cuda", "cpu", "eval", "train", "register_buffer", "extra_repr"}
)


def compute_use(node: ast.AST, analysis: SolutionAnalysis) -> str | None:
    """What torch (or numpy) compute one call or operator performs, described for the model;
    ``None`` for glue, the solution's own code and plain Python."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
        return "matmul (the @ operator)"
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    qualified = analysis.resolve(func)
    if qualified:
        if analysis.own_op(qualified) is not None:
            return None  # the solution's registered op: its body is on the forward path
        if module_of(qualified) == "numpy":
            return qualified
        if module_of(qualified) == "torch" and not (
            is_glue_torch(qualified) or is_passive_layer(qualified)
        ):
            return qualified
        return None
    layer = analysis.layer_of(func)
    if layer:
        return f"{ast.unparse(func)} ({layer.replace('torch.nn.', 'nn.')})"
    if isinstance(func, ast.Attribute):
        kind = analysis.receiver(func.value)
        if kind == "layer" and func.attr not in _MODULE_PLUMBING:
            return f"{ast.unparse(func)} ({analysis.layer_of(func.value)})"
        if kind == "unknown" and not is_glue_method(func.attr) and not func.attr.startswith("__"):
            if func.attr in _PY_METHODS and func.attr not in _TENSOR_ALSO:
                return None
            if not _is_tensor_method(func.attr):
                return None  # no tensor has it: a mistake (``unknown_api``) or the solution's own
            return f"Tensor.{func.attr}"
    return None


def _is_tensor_method(name: str) -> bool:
    import torch

    return hasattr(torch.Tensor, name)


# Pseudo op names ``reference_ops`` adds for compute that is not a named call.
ARITHMETIC = "<arithmetic>"
LAYER = "<nn layer>"
_SCALAR_CALLS = frozenset({"size", "numel", "dim", "len", "int", "float", "stride", "range"})


def _arithmetic(node: ast.AST) -> bool:
    """An operator on values that may be tensors (``x * w``, ``-x``, ``a < b``); arithmetic on
    constants and shapes (``x.shape[1] // 2``, ``-1``) is index math, not the task's compute."""
    if isinstance(node, ast.BinOp):
        operands = [node.left, node.right]
    elif isinstance(node, ast.UnaryOp) and not isinstance(node.op, ast.Not):
        operands = [node.operand]
    elif isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
    else:
        return False
    return not all(_scalar(operand) for operand in operands)


def _scalar(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Attribute):
        return node.attr in ("shape", "ndim") or _scalar(node.value)
    if isinstance(node, ast.Subscript):
        return _scalar(node.value)
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        return name in _SCALAR_CALLS
    if isinstance(node, ast.BinOp | ast.UnaryOp):
        return not _arithmetic(node)
    return False


def is_data_movement(ref_ops: set[str]) -> bool:
    """The reference's own forward only moves data (``cat``, a broadcasting ``copy_``,
    ``permute`` + ``contiguous``, ``pad``, ``transpose`` + ``repeat``): every op it runs is glue
    or moves data (``MOVEMENT_OPS``) and no operator or layer computes. Only then can torch glue
    in a solution *be* the task, so only then are the reference's own copying ops and the glue
    budget limited."""
    return bool(ref_ops) and all(_named_in(op, GLUE_TORCH_OPS | MOVEMENT_OPS) for op in ref_ops)


def _named_in(op: str, names: frozenset[str]) -> bool:
    """``reference_ops`` strips the in-place underscore (``copy_`` -> ``copy``)."""
    return op in names or op + "_" in names


def reference_ops(reference_source: str | None) -> set[str]:
    """The op names (``softmax``, ``cat``, ``linear``) the reference's forward path calls, plus
    ``ARITHMETIC`` for operators on tensors and ``LAYER`` for ``nn`` layer calls."""
    if not reference_source:
        return set()
    try:
        analysis = SolutionAnalysis(
            reference_source.replace("class Model(", "class ModelNew(", 1), "triton"
        )
    except SyntaxError:
        return set()
    ops: set[str] = set()
    for node in analysis.forward_nodes():
        if _arithmetic(node):
            ops.add(ARITHMETIC)
        if not isinstance(node, ast.Call):
            continue
        if analysis.layer_of(node.func) or _opaque_call(node, analysis):
            ops.add(LAYER)
        qualified = analysis.resolve(node.func)
        if qualified:
            ops.add(torch_op_name(qualified) or "")
        elif isinstance(node.func, ast.Attribute) and analysis.receiver(node.func.value) in (
            "unknown",
        ):
            ops.add(node.func.attr.rstrip("_"))
    return ops - {""}


def _opaque_call(call: ast.Call, analysis: SolutionAnalysis) -> bool:
    """A call of something the reference holds rather than names: a loop variable over its
    layers, ``self.blocks[i]``, a submodule built by a helper (``self.block(x)``). It may
    compute, so the reference is not taken for one that only moves data."""
    func = call.func
    if analysis.resolve(func):
        return False
    if isinstance(func, ast.Name):
        known = set(analysis.functions) | set(analysis.classes) | set(dir(builtins))
        return func.id not in known
    if isinstance(func, ast.Subscript | ast.Call):
        return True
    return is_self_attribute(func) and func.attr not in analysis.methods  # type: ignore[union-attr]


def check_no_custom_kernel(analysis: SolutionAnalysis, ref_ops: set[str]) -> list[CheckFailure]:
    if analysis.forward is None:
        return [
            CheckFailure(
                "no_custom_kernel", "ModelNew has no forward method, so no kernel can run."
            )
        ]
    backend = get_backend(analysis.backend)
    kernels = backend.find_kernels(analysis.tree, analysis.names.imports)
    if not kernels:
        return [
            CheckFailure(
                "no_custom_kernel",
                f"No {backend.kernel_form} is defined: write the computation as a "
                f"{backend.display_name} kernel.",
            )
        ]
    if any(
        isinstance(node, ast.Call) and backend.launches(analysis, node)
        for node in analysis.forward_nodes()
    ):
        return []
    return [
        CheckFailure(
            "no_custom_kernel",
            f"{backend.display_name} kernels are defined ({', '.join(sorted(kernels))}) but none "
            f"is launched {backend.launch_form} from ModelNew.forward.",
            analysis.forward.lineno,
        )
    ]


def check_torch_fallback(analysis: SolutionAnalysis, ref_ops: set[str]) -> list[CheckFailure]:
    failures = []
    # A data-movement task: its own copy op would do the work. Elsewhere copies and casts
    # around the kernel are glue that costs runtime, not the task.
    copying = (
        {op for op in ref_ops if _named_in(op, COPYING_TORCH_OPS)}
        if is_data_movement(ref_ops)
        else set()
    )
    defines_model = "Model" in analysis.classes
    parents: dict[int, ast.AST] = {}
    for fn in analysis.compute_path:
        parents.update(parent_map(fn))

    def fail(message: str, node: ast.AST) -> None:
        failures.append(CheckFailure("torch_fallback", message, getattr(node, "lineno", None)))

    holders = _compute_holders(analysis)
    for node in analysis.compute_nodes():
        key = holder_key(node) if isinstance(node, ast.Name | ast.Attribute) else None
        if key in holders and isinstance(getattr(node, "ctx", None), ast.Load):
            fail(
                f"forward reads {key}, which holds the PyTorch computation {holders[key]}; "
                "compute it in your kernel.",
                node,
            )
            continue
        if isinstance(node, ast.Name) and node.id == "Model" and not defines_model:
            fail("forward runs the reference Model instead of a kernel.", node)
            continue
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "forward"
            and isinstance(node.func.value, ast.Call)
            and isinstance(node.func.value.func, ast.Name)
            and node.func.value.func.id == "super"
        ):
            fail("forward runs the reference Model (super().forward) instead of a kernel.", node)
            continue
        used = compute_use(node, analysis)
        if used is None and isinstance(node, ast.Call):
            qualified = analysis.resolve(node.func) or ""
            op = torch_op_name(qualified) if qualified else None
            if (
                op is None
                and isinstance(node.func, ast.Attribute)
                and analysis.receiver(node.func.value) == "unknown"
            ):
                op = node.func.attr.rstrip("_")
            if op in copying:
                used = f"{op} (the reference's own op)"
        if used is None and isinstance(node, ast.Name | ast.Attribute):
            used = _torch_reference(node, analysis, parents)
        if used:
            fail(
                f"forward uses the PyTorch/numpy computation {used}; only allocation, views, "
                "copies, casts and padding may run outside your kernel - compute it in your "
                "kernel.",
                node,
            )
    for node in import_time_tensor_arithmetic(analysis):
        fail(
            f"at import, {ast.unparse(node)[:80]} computes with torch tensors: a table built when "
            "the module loads is work no checked call sees; compute it in your kernel.",
            node,
        )
    return failures


# Tensor attributes that are tensors themselves (``t.T``); every other attribute of a tensor
# (``t.shape``, ``t.dtype``) is metadata.
_TENSOR_ATTRIBUTES = frozenset({"T", "mT", "H", "mH", "real", "imag", "data"})
_TENSOR_CLASSES = frozenset({"torch.nn.Parameter", "torch.nn.Buffer", "torch.Tensor"})


def import_time_tensor_arithmetic(analysis: SolutionAnalysis) -> list[ast.AST]:
    """Operators (``*``, ``/``, ``**``, ``-x``, ``<``, ``+=``) on tensors in code that runs
    when the module is imported (module level, class bodies): torch computing there, in
    arithmetic rather than a call. Tensors are what torch's tensor functions return, the names
    bound to them there, and their views, items and methods (``t.float()``; not metadata such as
    ``t.shape[0] * 2``). Import-time compute is audited at run time too (``init_compute``)."""
    statements = analysis.import_time_code().body
    tensors: set[str] = set()

    def is_tensor(node: ast.AST | None) -> bool:
        if isinstance(node, ast.Name):
            return node.id in tensors
        if isinstance(node, ast.Call):
            qualified = analysis.resolve(node.func)
            if qualified:
                return _makes_tensor(qualified)
            func = node.func
            return (
                isinstance(func, ast.Attribute)
                and func.attr not in METADATA_OPS
                and is_tensor(func.value)
            )
        if isinstance(node, ast.Attribute):
            return node.attr in _TENSOR_ATTRIBUTES and is_tensor(node.value)
        if isinstance(node, ast.Subscript | ast.Starred):
            return is_tensor(node.value)
        if isinstance(node, ast.BinOp):
            return is_tensor(node.left) or is_tensor(node.right)
        if isinstance(node, ast.UnaryOp):
            return is_tensor(node.operand)
        if isinstance(node, ast.IfExp):
            return is_tensor(node.body) or is_tensor(node.orelse)
        return False

    nodes = [n for statement in statements for n in _walk_outside_functions(statement)]
    for _ in range(3):  # names bound from names bound earlier
        for node in nodes:
            if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign) and is_tensor(
                node.value
            ):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                tensors.update(
                    t.id for t in flatten_targets(list(targets)) if isinstance(t, ast.Name)
                )
    found: list[ast.AST] = []
    for node in nodes:
        if isinstance(node, ast.BinOp):
            operands: list[ast.AST] = [node.left, node.right]
        elif isinstance(node, ast.UnaryOp) and not isinstance(node.op, ast.Not):
            operands = [node.operand]
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.AugAssign):
            operands = [node.target, node.value]
        else:
            continue
        if any(is_tensor(operand) for operand in operands):
            found.append(node)
    return found


def _makes_tensor(qualified: str) -> bool:
    """A torch function whose result is a tensor: an allocation, view, copy or cast, or compute
    (anything public that is neither metadata, a value, a class nor a namespace's plumbing)."""
    if qualified in _TENSOR_CLASSES:
        return True
    parts = qualified.split(".")
    if parts[0] != "torch" or len(parts) < 2 or parts[1] in ("cuda", "backends", "library"):
        return False
    leaf = parts[-1]
    if leaf in METADATA_OPS or leaf[:1].isupper():
        return False
    return leaf in GLUE_TORCH_OPS or not is_torch_value(qualified)


def _walk_outside_functions(root: ast.AST) -> list[ast.AST]:
    """``ast.walk`` that does not enter function or lambda bodies (they run when called)."""
    found, stack = [], [root]
    while stack:
        node = stack.pop()
        found.append(node)
        stack.extend(
            child
            for child in ast.iter_child_nodes(node)
            if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        )
    return found


def _compute_holders(analysis: SolutionAnalysis) -> dict[str, str]:
    """Names and ``self.`` attributes bound to a table, partial or lambda that holds a torch
    compute function (``OPS = {"sum": torch.nansum}``), so calling through them is compute."""
    holders: dict[str, str] = {}
    parents = parent_map(analysis.tree)
    for target, value in bindings(analysis.tree):
        if isinstance(value, ast.Name | ast.Attribute):
            continue  # plain aliases are resolved by name
        key = holder_key(target)
        if key is None or key in holders:
            continue
        for node in ast.walk(value):
            if isinstance(node, ast.Name | ast.Attribute):
                used = _torch_reference(node, analysis, parents)
                if used:
                    holders[key] = used.split(" ", 1)[0]
                    break
    return holders


def _torch_reference(
    node: ast.Name | ast.Attribute, analysis: SolutionAnalysis, parents: dict[int, ast.AST]
) -> str | None:
    """A torch compute function named without being called here (``fns = [torch.nansum]``,
    ``map(torch.exp, xs)``): it will be called somewhere the AST does not show."""
    if not isinstance(node.ctx, ast.Load):
        return None
    parent = parents.get(id(node))
    if isinstance(parent, ast.Attribute) and parent.value is node:
        return None  # only the full chain counts
    if isinstance(parent, ast.Call) and parent.func is node:
        return None  # calls are judged by compute_use
    qualified = analysis.resolve(node)
    if not qualified or module_of(qualified) != "torch" or is_torch_value(qualified):
        return None
    if analysis.own_op(qualified) is not None:
        return None
    leaf = qualified.rsplit(".", 1)[-1]
    if leaf[:1].isupper() or (leaf.startswith("__") and leaf.endswith("__")):
        return None  # classes are judged when instantiated; dunders elsewhere
    return f"{qualified} (referenced, to be called indirectly)"


def check_try_except_fallback(analysis: SolutionAnalysis, ref_ops: set[str]) -> list[CheckFailure]:
    failures = []
    for node in ast.walk(analysis.tree):
        if not isinstance(node, ast.Try | ast.TryStar):
            continue
        for handler in node.handlers:
            for inner in ast.walk(handler):
                computes = compute_use(inner, analysis) is not None
                if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name):
                    computes |= inner.func.id == "Model"
                if computes:
                    failures.append(
                        CheckFailure(
                            "try_except_fallback",
                            "an except handler computes the result with PyTorch when the kernel "
                            "fails; let errors propagate instead of falling back.",
                            handler.lineno,
                        )
                    )
                    break
    return failures
