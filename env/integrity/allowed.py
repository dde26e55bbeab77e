"""What a solution's source may reference at all, as data: the allow-list behind
``unlisted_reference`` (``reference_checks``).

A solution runs in the same interpreter as the sandbox's harness. Any path to Python's
reflection (frames, the garbage collector, closures, ``getattr`` as a value, private torch
modules, the task's source in ``linecache``) lets it rewrite the evidence the harness reports.
Deny-lists of such paths were outgrown by the next spelling, so here nothing is reachable unless
it is listed: modules, their members, builtins, and the attribute names that may be read on a
value whose type the checker cannot know. The attribute vocabulary is read off the real classes
(``torch.Tensor``, ``nn.Module``, ...) of the installed torch, so it follows torch's version.
"""

from __future__ import annotations

import builtins
import functools
import string
import types
from typing import Any

from kernelrl.env.integrity.forbidden import INTROSPECTION_ATTRIBUTES
from kernelrl.env.python_syntax import parse_source_of

# Modules a solution may import or reach, each with the members it may use: ``None`` means any
# public member (pure compute or type namespaces), a set lists the members one by one.
MODULE_MEMBERS: dict[str, frozenset[str] | None] = {
    "torch": None,
    "torch.nn": None,
    "torch.nn.functional": None,
    "torch.nn.init": None,
    "torch.linalg": None,
    "torch.fft": None,
    "torch.special": None,
    "torch.cuda": frozenset(
        [
            "synchronize",
            "is_available",
            "device_count",
            "current_device",
            "get_device_properties",
            "get_device_capability",
            "get_device_name",
            "current_stream",
            "device",
        ]
    ),
    "torch.library": frozenset(
        ["triton_op", "wrap_triton", "custom_op", "register_fake", "register_autograd"]
    ),
    "torch.autograd": frozenset(["Function"]),
    "torch.utils": frozenset(["cpp_extension"]),
    "torch.utils.cpp_extension": frozenset(["load_inline"]),
    "triton": frozenset(
        [
            "jit",
            "autotune",
            "heuristics",
            "Config",
            "cdiv",
            "next_power_of_2",
            "language",
            "set_allocator",
            "__version__",
        ]
    ),
    "triton.language": None,
    "triton.language.math": None,
    "triton.language.extra": frozenset(["libdevice", "cuda"]),
    "triton.language.extra.libdevice": None,
    "triton.language.extra.cuda": frozenset(["libdevice"]),
    "triton.language.extra.cuda.libdevice": None,
    "math": None,
    "functools": frozenset(["partial", "reduce", "wraps", "lru_cache", "cache"]),
    "itertools": frozenset(["product", "chain", "repeat", "islice", "accumulate"]),
    "operator": frozenset(["add", "sub", "mul", "truediv", "floordiv", "mod", "neg", "index"]),
    "typing": frozenset(
        ["Any", "Optional", "Union", "Tuple", "List", "Dict", "Sequence", "Callable", "Iterable"]
    ),
    "collections": frozenset(["OrderedDict", "defaultdict", "namedtuple"]),
    "dataclasses": frozenset(["dataclass", "field"]),
    "os": frozenset(["environ", "getenv"]),
    "__future__": frozenset(["annotations"]),
}
# torch is opened as a whole namespace; these public members of it are not opened: files, the
# random generator's state (the inputs' seed), hooks that run code where no audit looks.
DENIED_MODULE_MEMBERS = frozenset(
    [
        "torch.load",
        "torch.save",
        "torch.from_file",
        "torch.manual_seed",
        "torch.seed",
        "torch.initial_seed",
        "torch.get_rng_state",
        "torch.set_rng_state",
        "torch.Generator",
        "torch.default_generator",
        "torch.set_default_device",
        "torch.nn.modules",
        "torch.nn.parameter",
        "torch.nn.utils",
    ]
)

# Builtins a solution may name. Everything else (``getattr`` as a value, ``type``, ``vars``,
# ``open``, ``help`` and its pager, ``SystemExit``...) is not on the list.
BUILTINS = frozenset(
    [
        "abs",
        "all",
        "any",
        "bool",
        "callable",
        "dict",
        "divmod",
        "enumerate",
        "filter",
        "float",
        "frozenset",
        "int",
        "isinstance",
        "issubclass",
        "iter",
        "len",
        "list",
        "map",
        "max",
        "min",
        "next",
        "object",
        "pow",
        "print",
        "property",
        "range",
        "repr",
        "reversed",
        "round",
        "set",
        "slice",
        "sorted",
        "staticmethod",
        "classmethod",
        "str",
        "sum",
        "super",
        "tuple",
        "zip",
        "hasattr",
        "getattr",
        "NotImplemented",
        "Ellipsis",
        "__name__",
        "Exception",
        "ArithmeticError",
        "AssertionError",
        "AttributeError",
        "ImportError",
        "IndexError",
        "KeyError",
        "LookupError",
        "ModuleNotFoundError",
        "NotImplementedError",
        "OverflowError",
        "RuntimeError",
        "StopIteration",
        "TypeError",
        "ValueError",
        "ZeroDivisionError",
    ]
)
# Builtins that name an attribute: only called, with a constant name that is itself allowed.
NAME_TAKING_BUILTINS = frozenset(["getattr", "hasattr"])

# Dunder attributes that may be read; every other dunder is introspection.
READABLE_DUNDERS = frozenset(["__init__", "__name__", "__qualname__", "__doc__", "__version__"])
# Dunder methods a solution's class may define. Others run implicitly where no audit looks
# (``__del__``, ``__getattr__``, descriptors) or change how the harness sees an object.
DEFINABLE_DUNDERS = frozenset(["__init__", "__call__", "__repr__"])
# Classes a solution's class may derive from (besides its own classes).
BASE_CLASSES = frozenset(
    ["torch.nn.Module", "torch.autograd.Function", "object", "Exception", "RuntimeError"]
    + ["ValueError"]
)
# Keyword arguments that hand the callee code to run outside the forward call's view.
HOOK_KEYWORDS = frozenset(
    ["pre_hook", "post_hook", "prune_configs_by", "early_config_prune", "perf_model"]
    + ["launch_metadata"]
)
# Public members that are still not for a solution: hooks, reading values to Python (compute
# in plain Python), subclassing by the back door, sharing memory, files, frames.
DENIED_MEMBERS = frozenset(
    [
        "register_hook",
        "register_post_accumulate_grad_hook",
        "register_prehook",
        "register_forward_hook",
        "register_forward_pre_hook",
        "register_full_backward_hook",
        "register_full_backward_pre_hook",
        "register_backward_hook",
        "register_state_dict_pre_hook",
        "register_state_dict_post_hook",
        "register_load_state_dict_pre_hook",
        "register_load_state_dict_post_hook",
        "add_pre_run_hook",
        "pre_run_hooks",
        "pre_hook",
        "post_hook",
        "tolist",
        "numpy",
        "apply_",
        "map_",
        "map2_",
        "as_subclass",
        "share_memory_",
        "from_file",
        "format_map",
        "with_traceback",
        "register_torch_dispatch",
    ]
) | {name for name in INTROSPECTION_ATTRIBUTES if not name.startswith("_")}  # frames, code


@functools.cache
def value_attributes() -> frozenset[str]:
    """Public attribute names of the values a solution works with, read off the installed
    classes: tensors, modules, parameters, sizes, dtypes, devices, Triton configs and device
    tensors, Python's own containers and numbers, autograd contexts and device properties."""
    import torch
    import triton
    import triton.language as tl

    classes: list[Any] = [
        torch.Tensor,
        torch.nn.Module,
        torch.nn.Parameter,
        torch.Size,
        torch.dtype,
        torch.device,
        torch.finfo,
        torch.iinfo,
        torch.autograd.function.FunctionCtx,
        triton.Config,
        tl.tensor,
        tl.dtype,
        int,
        float,
        bool,
        str,
        list,
        tuple,
        dict,
        set,
        frozenset,
        slice,
        range,
        BaseException,
    ]
    properties = getattr(torch._C, "_CudaDeviceProperties", None)
    if properties is not None:
        classes.append(properties)
    try:  # what torch.library.custom_op / triton_op return (``@op.register_fake``)
        from torch._library.custom_ops import CustomOpDef

        classes.append(CustomOpDef)
    except ImportError:  # pragma: no cover - torch without custom ops
        pass
    names = {name for cls in classes for name in dir(cls) if not name.startswith("_")}
    names |= _layer_fields() | INSTANCE_ATTRIBUTES
    return frozenset(names - DENIED_MEMBERS)


# Attributes set on instances rather than classes, so ``dir`` of the class misses them.
INSTANCE_ATTRIBUTES = frozenset(
    ["weight", "bias", "running_mean", "running_var", "num_batches_tracked", "in_proj_weight"]
    + ["in_proj_bias", "out_proj", "element_ty", "address_space", "primitive_bitwidth", "numel"]
    + ["type", "value", "kwargs", "num_warps", "num_stages", "num_ctas", "maxnreg"]
)


@functools.cache
def library_object_attributes() -> frozenset[str]:
    """Public attribute names of the objects whose attributes are code that Triton or torch
    runs: Triton's kernels, autotuners and heuristics (``fn``, ``run``, ``cache``, ``configs``,
    ``src``...), read off the installed classes and the attributes their methods set on
    ``self``, and ``torch.library``'s op objects. Writing one of these anywhere but on the
    solution's own ``self`` changes what a launch runs (``reference_checks``)."""
    import ast

    from triton.runtime.autotuner import Autotuner, Heuristics
    from triton.runtime.jit import JITFunction

    classes: list[Any] = [JITFunction, Autotuner, Heuristics]
    try:
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    except ImportError:  # pragma: no cover - Triton without the interpreter
        pass
    try:
        from torch._library.custom_ops import CustomOpDef

        classes.append(CustomOpDef)
    except ImportError:  # pragma: no cover - torch without custom ops
        pass
    names: set[str] = set()
    for cls in {base for owner in classes for base in owner.__mro__ if base is not object}:
        names.update(name for name in dir(cls) if not name.startswith("_"))
        try:
            tree = parse_source_of(cls)
        except (OSError, TypeError, SyntaxError, IndentationError):
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
                and not node.attr.startswith("_")
            ):
                names.add(node.attr)
    return frozenset(names)


def _layer_fields() -> set[str]:
    """The public fields that ``torch.nn``'s layers declare (``Conv2d.padding``,
    ``Linear.out_features``): their ``__constants__`` and annotations."""
    import inspect

    import torch

    names: set[str] = set()
    for name in dir(torch.nn):
        layer = getattr(torch.nn, name)
        if inspect.isclass(layer) and issubclass(layer, torch.nn.Module):
            for cls in layer.__mro__:
                names.update(getattr(cls, "__constants__", None) or [])
                names.update(vars(cls).get("__annotations__", {}))
    return {name for name in names if not name.startswith("_")}


@functools.cache
def private_members() -> frozenset[str]:
    """Underscored names of torch's tensors and modules: a solution's own ``self._x`` may not
    be one of them (``self._forward_hooks`` is the module's hook table, not a new attribute)."""
    import torch

    return frozenset(
        name
        for cls in (torch.Tensor, torch.nn.Module, object)
        for name in dir(cls)
        if name.startswith("_")
    )


def shadowable_builtins() -> frozenset[str]:
    """Builtins a module-level or class-level name may not rebind: Python looks such a name up
    in the builtins when the binding has not run, so rebinding one would name it by the back
    door."""
    return frozenset(name for name in dir(builtins) if name not in BUILTINS)


def module_rule(qualified: str) -> tuple[str | None, str | None]:
    """Whether ``qualified`` (``torch.nn.functional.relu``) may be referenced: ``(None, None)``
    when it may, else ``(what, why)``. The chain is followed on the real objects of the
    trusted process, so an alias (``torch.os``, ``torch.nn.modules.module``) is judged by what
    it is, not by how it is spelled."""
    import importlib

    parts = qualified.split(".")
    if parts[0] not in {name.split(".")[0] for name in MODULE_MEMBERS}:
        return qualified, f"module {parts[0]!r} is not on the allow-list"
    if qualified in MODULE_MEMBERS:
        return None, None
    if parts[:2] == ["torch", "ops"]:
        return _torch_ops_rule(qualified, parts)
    try:
        obj: Any = importlib.import_module(parts[0])
    except ImportError:
        return qualified, f"module {parts[0]!r} is not installed"
    path = parts[0]
    for part in parts[1:]:
        members = MODULE_MEMBERS.get(path) if isinstance(obj, types.ModuleType) else None
        name = f"{path}.{part}"
        if part.startswith("_") and part not in READABLE_DUNDERS:
            return name, "private names are not on the allow-list"
        if name in DENIED_MODULE_MEMBERS or part in DENIED_MEMBERS:
            return name, "this member is not on the allow-list"
        if isinstance(obj, types.ModuleType) and members is not None and part not in members:
            return name, "this member is not on the allow-list"
        try:
            obj = getattr(obj, part)
        except AttributeError:
            try:  # a submodule that its package does not import by itself
                obj = importlib.import_module(name)
            except ImportError:
                # A public name that does not exist reaches nothing: Python reports it when the
                # solution runs (a mistyped Triton API is a compile error, not a hack).
                return None, None
        if isinstance(obj, types.ModuleType) and obj.__name__ not in MODULE_MEMBERS:
            return name, f"it is the module {obj.__name__!r}, which is not on the allow-list"
        path = name
    return None, None


def _torch_ops_rule(qualified: str, parts: list[str]) -> tuple[str | None, str | None]:
    """``torch.ops.<namespace>.<op>[.<overload>]``: ops registered by the solution itself or
    aten ops (whether those are compute is ``torch_fallback``'s to judge). Nothing private, and
    none of ``torch.ops``' own methods (``load_library`` loads native code, ``import_module``
    any module)."""
    import torch

    if any(part.startswith("_") for part in parts[2:]):
        return qualified, "private names are not on the allow-list"
    if len(parts) > 2 and _is_ops_member(torch.ops, parts[2]):
        return ".".join(parts[:3]), "torch.ops' own members are not on the allow-list"
    if len(parts) > 5:
        return qualified, "only torch.ops.<namespace>.<op>.<overload> is on the allow-list"
    return None, None


@functools.cache
def hook_parameters(qualified: str) -> tuple[tuple[str, int], ...]:
    """The hook parameters (``HOOK_KEYWORDS``) of the callable ``qualified`` names, with their
    positions, read off its real signature (``triton.Config``'s ``pre_hook`` is its sixth
    positional parameter)."""
    import importlib
    import inspect

    if module_rule(qualified) != (None, None):
        return ()  # not reachable at all: ``unlisted_reference`` says so
    parts = qualified.split(".")
    try:
        obj: Any = importlib.import_module(parts[0])
        for part in parts[1:]:
            obj = getattr(obj, part)
        parameters = list(inspect.signature(obj).parameters.values())
    except Exception:  # an object that cannot be read (a lazy driver) or has no signature
        return ()
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return tuple(
        (p.name, positional.index(p) if p in positional else 1 << 30)
        for p in parameters
        if p.name in HOOK_KEYWORDS
    )


def _is_ops_member(ops: Any, name: str) -> bool:
    """A method or attribute of ``torch.ops`` itself rather than an op namespace."""
    import torch

    if hasattr(type(ops), name):
        return True
    value = vars(ops).get(name)
    return value is not None and not isinstance(value, torch._ops._OpNamespace)


def is_module_path(qualified: str) -> bool:
    """True when ``qualified`` names a module itself (``torch``, ``torch.nn.functional``)."""
    return qualified in MODULE_MEMBERS


def format_fields(text: str) -> list[str]:
    """The field names of a format string (``"{0.__class__}"`` -> ``["0.__class__"]``)."""
    try:
        return [field for _, field, _, _ in string.Formatter().parse(text) if field is not None]
    except ValueError:
        return ["<malformed>"]
