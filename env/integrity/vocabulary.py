"""The op vocabulary: what torch may do inside a solution's ``forward`` without doing its work.

One allow-list, read by the static checks (Python-level names), the runtime audit in the
sandbox (aten op names seen by a dispatch mode and by CUPTI's CPU events), the GPU kernel check
(kernel names seen by CUPTI) and curation's difficulty tagging. Everything *not* listed here is
torch compute: a new torch op, a private fused aten op or a renamed alias is compute by default,
so an allow-list cannot be bypassed by finding an op that a deny-list forgot.
"""

from __future__ import annotations

import re

# --------------------------------------------------------------------------- aten (runtime)
# Allocation, views, copies, casts and padding: data movement, never arithmetic on the values.
GLUE_ATEN_OPS = frozenset(
    "aten::" + name
    for name in [
        # allocation
        "empty",
        "empty_like",
        "empty_strided",
        "empty_permuted",
        "new_empty",
        "new_empty_strided",
        "zeros",
        "zeros_like",
        "new_zeros",
        "ones",
        "ones_like",
        "new_ones",
        "full",
        "full_like",
        "new_full",
        "scalar_tensor",
        "arange",
        "lift_fresh",
        "lift_fresh_copy",
        "resize_",
        # views and shape
        "view",
        "_unsafe_view",
        "view_as",
        "reshape",
        "reshape_as",
        "ravel",
        "numpy_T",
        "mT",
        "matrix_H",
        "mH",
        "_reshape_alias",
        "as_strided",
        "expand",
        "expand_as",
        "permute",
        "transpose",
        "t",
        "squeeze",
        "unsqueeze",
        "flatten",
        "unflatten",
        "select",
        "slice",
        "narrow",
        "split",
        "split_with_sizes",
        "chunk",
        "unbind",
        "alias",
        "detach",
        "detach_",
        "movedim",
        "swapaxes",
        "swapdims",
        "view_as_real",
        "view_as_complex",
        "contiguous",
        # copies, casts, fills, padding
        "clone",
        "copy_",
        "_copy_from",
        "_copy_from_and_resize",
        "to",
        "_to_copy",
        "type_as",
        "fill_",
        "zero_",
        "constant_pad_nd",
        "pad",
        "cat",
        "concat",
        "concatenate",
        "stack",
        # metadata (reading a tensor's values into Python, ``item``/``float()``/``bool()``, is
        # not: what is computed from them in plain Python no audit can see)
        "size",
        "stride",
        "sym_size",
        "sym_stride",
        "sym_numel",
        "sym_storage_offset",
        "is_same_size",
        "result_type",
        "set_",
        "record_stream",
    ]
)

# Ops whose bytes count against the glue budget: they move data, so a solution could hand a
# data-movement task's whole work to them.
COPYING_ATEN_OPS = frozenset(
    "aten::" + name
    for name in ["clone", "copy_", "_copy_from", "_copy_from_and_resize", "_to_copy"]
    + ["contiguous", "constant_pad_nd", "pad", "cat", "stack"]
)


def is_glue_aten(name: str) -> bool:
    """True for an op a solution may dispatch in ``forward`` without torch doing its work: an
    aten glue op (``aten::name`` or ``aten::name.overload``) or an op the solution registered
    from its own function (``is_solution_op``); everything else is compute."""
    base = name.split(".", 1)[0]
    if "::" in base and not base.startswith("aten::") and is_solution_op(base):
        return True
    if not base.startswith("aten::"):
        base = "aten::" + base
    return base in GLUE_ATEN_OPS


def is_solution_op(qualname: str) -> bool:
    """True when ``ns::name`` was registered with ``torch.library.custom_op``/``triton_op`` from
    a function the solution module defines (read from torch's registry, in the sandbox where the
    solution runs).

    Such an op is the solution's own wrapper around its kernels (PyTorch's documented way to
    register a Triton kernel), not torch compute: the op itself is glue, and the audit runs its
    body under the same dispatch mode (``AtenAudit``), so the ops the body dispatches are judged
    one by one. An op registered by torch or from any other module
    (``custom_op("x::y", torch.add)``) stays compute.
    """
    if qualname.startswith("aten::"):  # every op an audit sees is asked: aten's never are
        return False
    try:
        from torch._library.custom_ops import OPDEFS
    except ImportError:  # pragma: no cover - torch without custom ops
        return False
    from kernelrl.env.sandbox.protocol import SOLUTION_MODULE

    opdef = OPDEFS.get(qualname)
    if opdef is None:
        return False
    # Every implementation the op may run (device kernels registered later included) must be
    # the solution's: a kernel registered from elsewhere would be torch doing the work.
    functions = [opdef._init_fn, *opdef._backend_fns.values()]
    functions += [*opdef._torch_dispatch_fns.values(), opdef._setup_context_fn]
    functions += [opdef._backward_fn, opdef._vmap_fn]
    return all(_user_function_module(fn) == SOLUTION_MODULE for fn in functions if fn is not None)


def _user_function_module(fn: object) -> str | None:
    """The module of the function a user registered. torch keeps it wrapped: ``triton_op``'s
    ``backend_fn`` and ``register_kernel``'s ``wrapped_fn`` are closures over ``fn`` (the latter
    behind ``functools.wraps``), so wrappers defined in torch are unwrapped to their ``fn``."""
    for _ in range(8):
        fn = getattr(fn, "__wrapped__", fn)
        module = getattr(fn, "__module__", None) or ""
        code = getattr(fn, "__code__", None)
        if not (module.startswith("torch.") and code is not None):
            break
        cells = dict(zip(code.co_freevars, getattr(fn, "__closure__", None) or (), strict=False))
        if "fn" not in cells:
            break
        fn = cells["fn"].cell_contents
    return getattr(fn, "__module__", None)


# --------------------------------------------------------------------------- GPU kernels
# torch's own kernels that only move or fill memory. A CUDA kernel name carries its functor in
# its template arguments, so torch's generic ``elementwise_kernel`` is told apart by it: a copy is
# ``direct_copy_kernel``, an add would be ``AddFunctor`` / ``add_kernel``.
_TRIVIAL_KERNEL = re.compile(
    r"direct_copy_kernel|copy_kernel|CatArrayBatchedCopy|FillFunctor|fill_kernel"
    r"|memset|Memset|Memcpy|memcpy|zero_kernel|constant_pad|pad_kernel"
)


def is_trivial_gpu_kernel(name: str) -> bool:
    """True for a non-solution GPU kernel allowed to run during a call (memset/copy/fill)."""
    return bool(_TRIVIAL_KERNEL.search(name))


# --------------------------------------------------------------------------- Python (static)
# What a solution may *call* through torch inside ``forward``: allocation, views and reshapes,
# copies and casts, padding glue, metadata. Looked up by the op's leaf name in torch's public op
# namespaces (``torch.X``, ``torch.Tensor.X``, a method on a tensor, ``F.X``); everything else
# reached through torch is compute. Only ``pad`` is glue in ``torch.nn.functional``.
ALLOCATION_OPS = frozenset(
    [
        "empty",
        "empty_like",
        "empty_strided",
        "zeros",
        "zeros_like",
        "ones",
        "ones_like",
        "full",
        "full_like",
        "arange",
        "tensor",
        "as_tensor",
        "new_empty",
        "new_empty_strided",
        "new_zeros",
        "new_ones",
        "new_full",
        "new_tensor",
        "scalar_tensor",
    ]
)
VIEW_OPS = frozenset(
    [
        "as_strided",
        "contiguous",
        "view",
        "view_as",
        "reshape",
        "reshape_as",
        "ravel",
        "flatten",
        "unflatten",
        "squeeze",
        "unsqueeze",
        "permute",
        "transpose",
        "t",
        "expand",
        "expand_as",
        "narrow",
        "select",
        "unbind",
        "split",
        "split_with_sizes",
        "chunk",
        "movedim",
        "swapaxes",
        "swapdims",
        "detach",
        "view_as_real",
        "view_as_complex",
        "alias",
    ]
)
COPY_CAST_OPS = frozenset(
    [
        "clone",
        "copy_",
        "to",
        "type",
        "type_as",
        "float",
        "half",
        "bfloat16",
        "double",
        "int",
        "long",
        "short",
        "bool",
        "byte",
        "char",
        "cuda",
        "cpu",
        "fill_",
        "zero_",
        "pad",
        "constant_pad_nd",
        "cat",
        "concat",
        "concatenate",
        "stack",
        "requires_grad_",
        "record_stream",
        "pin_memory",
        "resize_",
    ]
)
METADATA_OPS = frozenset(
    [
        "size",
        "stride",
        "numel",
        "nelement",
        "dim",
        "ndimension",
        "element_size",
        "data_ptr",
        "storage_offset",
        "untyped_storage",
        "is_contiguous",
        "is_floating_point",
        "is_complex",
        "is_tensor",
        "is_nonzero",
        "is_same_size",
        "get_device",
        "item",
        "tolist",
        "result_type",
        "promote_types",
        "broadcast_shapes",
        "can_cast",
        "device",
        "Size",
        "finfo",
        "iinfo",
        "dtype",
        "manual_seed",
        "get_default_dtype",
        "no_grad",
        "inference_mode",
        "enable_grad",
        "set_grad_enabled",
        "is_grad_enabled",
        "set_printoptions",
        "is_inference_mode_enabled",
    ]
)
GLUE_TORCH_OPS = ALLOCATION_OPS | VIEW_OPS | COPY_CAST_OPS | METADATA_OPS
# Glue ops that copy data: when the task itself is a copy (its reference calls one of these),
# calling it does the task's work.
COPYING_TORCH_OPS = frozenset(
    ["clone", "copy_", "contiguous", "pad", "constant_pad_nd", "cat", "concat", "concatenate"]
    + ["stack", "to", "type", "type_as"]
)

# Ops that compute nothing but move, repeat or select data, beyond the glue above. A reference
# made of these and glue only moves data (``compute_checks.is_data_movement``), so torch glue
# in a solution could do its whole work; in a solution they stay compute: torch doing the moving.
MOVEMENT_OPS = frozenset(
    ["repeat", "tile", "repeat_interleave", "expand_copy", "broadcast_to", "narrow_copy"]
    + ["flip", "fliplr", "flipud", "roll", "rot90", "diagonal", "diag_embed", "unfold"]
    + ["index_select", "gather", "take", "take_along_dim", "masked_select"]
    + ["pixel_shuffle", "pixel_unshuffle", "channel_shuffle", "native_channel_shuffle"]
    + ["hstack", "vstack", "dstack", "column_stack", "row_stack", "moveaxis"]
    + ["tensor_split", "hsplit", "vsplit", "dsplit", "permute_copy"]
)

# Fully qualified torch names outside the op namespaces that are plumbing, not compute.
GLUE_TORCH_PATHS = frozenset(
    [
        "torch.nn.functional.pad",
        "torch.nn.Module",
        "torch.nn.Parameter",
        "torch.nn.Buffer",
        "torch.autograd.Function",
        "torch.cuda.current_device",
        "torch.cuda.device",
        "torch.cuda.device_of",
        "torch.cuda.is_available",
        "torch.cuda.device_count",
        "torch.cuda.get_device_properties",
        "torch.cuda.get_device_capability",
        "torch.cuda.get_device_name",
        "torch.cuda.synchronize",
        "torch.cuda.current_stream",
        "torch.cuda.default_stream",
        "torch.library.custom_op",
        "torch.library.register_fake",
        "torch.library.register_autograd",
        "torch.library.triton_op",
        "torch.library.wrap_triton",
        "torch.utils.cpp_extension.load_inline",
        "torch.utils.cpp_extension.load",
        "torch.Tensor",
    ]
)
# Non-callable torch values (dtypes, layouts, constants) and namespaces a solution may name.
TORCH_VALUES = frozenset(
    [
        "float32",
        "float",
        "float16",
        "half",
        "bfloat16",
        "float64",
        "double",
        "float8_e4m3fn",
        "float8_e5m2",
        "int8",
        "uint8",
        "int16",
        "short",
        "int32",
        "int",
        "int64",
        "long",
        "bool",
        "complex64",
        "complex128",
        "strided",
        "contiguous_format",
        "channels_last",
        "channels_last_3d",
        "preserve_format",
        "inf",
        "nan",
        "pi",
        "e",
        "newaxis",
        "Tensor",
        "Size",
        "device",
        "dtype",
        "Generator",
    ]
)
TORCH_NAMESPACES = frozenset(
    ["nn", "functional", "cuda", "ops", "aten", "special", "linalg", "fft", "backends"]
    + ["version", "utils", "library", "autograd", "Tensor", "types", "cpp_extension"]
)
# nn layers that hold no computation worth a kernel (containers, identity, dropout in eval).
PASSIVE_LAYERS = frozenset(
    [
        "Module",
        "Parameter",
        "Buffer",
        "Identity",
        "Dropout",
        "Flatten",
        "Unflatten",
        "ModuleList",
        "ModuleDict",
        "Sequential",
        "ParameterList",
        "ParameterDict",
    ]
)


def torch_op_name(qualified: str) -> str | None:
    """The op a fully qualified torch name calls: ``torch.nn.functional.softmax`` -> ``softmax``,
    ``torch.ops.aten.mm.default`` -> ``mm``, ``torch.Tensor.add_`` -> ``add``; ``None`` outside
    torch."""
    parts = qualified.split(".")
    if parts[0] != "torch" or len(parts) < 2:
        return None
    if parts[1] == "ops" and len(parts) >= 4:
        return parts[3].rstrip("_") or parts[3]
    op = parts[-1]
    return op if op.endswith("__") else (op.rstrip("_") or op)


def is_glue_torch(qualified: str) -> bool:
    """True for a fully qualified torch name that ``forward`` may call without doing the task's
    work (allocation, view, copy, cast, pad, metadata). Everything else under ``torch`` is
    compute — including ops this list has never heard of and private ``torch._*`` names."""
    if qualified in GLUE_TORCH_PATHS:
        return True
    parts = qualified.split(".")
    if parts[0] != "torch" or len(parts) < 2:
        return False
    if any(p.startswith("_") for p in parts[1:]):
        return False
    if parts[1] == "ops":
        return len(parts) >= 4 and parts[2] == "aten" and is_glue_aten(parts[3])
    if len(parts) == 2:
        return parts[1] in GLUE_TORCH_OPS
    if len(parts) == 3 and parts[1] == "Tensor":
        return parts[2] in GLUE_TORCH_OPS
    return False


def is_glue_method(name: str) -> bool:
    """True for a tensor method that is glue (``x.view``, ``x.contiguous``, ``x.size``)."""
    return name in GLUE_TORCH_OPS and name != "pad"


def is_torch_value(qualified: str) -> bool:
    """True for a torch name that may be *referenced* without being called: dtypes, constants,
    namespaces and glue (``torch.float16``, ``torch.cuda``, ``torch.empty``)."""
    parts = qualified.split(".")
    if parts[0] != "torch":
        return False
    if len(parts) == 1 or is_glue_torch(qualified):
        return True
    if any(p.startswith("_") for p in parts[1:]):
        return False
    return parts[-1] in TORCH_VALUES or all(p in TORCH_NAMESPACES for p in parts[1:])


def is_passive_layer(qualified: str) -> bool:
    """``torch.nn.Dropout`` and containers: layers that compute nothing themselves."""
    return qualified.startswith("torch.nn.") and qualified.rsplit(".", 1)[1] in PASSIVE_LAYERS
