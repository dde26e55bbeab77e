"""Static integrity checks: reward hacks that can be seen in the solution's AST before it runs.

Every check has a name (the status detail an EvalResult carries in ``checks_failed``), one precise
rule, and tests with a hacking solution it catches and a legitimate near-miss it passes
(``tests/solutions/static/``). The checks are conservative where a rule would otherwise forbid
ordinary kernel code, and the dynamic checks (``dynamic_checks``: profiler proof, aliasing,
mutation, reuse) back them up at run time, so obfuscation that slips past the AST is still caught.

The *forward path* is every function reachable from ``ModelNew.forward`` through calls to
functions and classes the solution defines (kernel bodies excluded: they are device code).

| check | rule |
| --- | --- |
| ``no_custom_kernel`` | no kernel of the task's backend is defined, or none is launched on the forward path |
| ``torch_fallback`` | the forward path calls a torch/aten op that does the task's computation: an op the reference's forward uses, a heavy op (matmul, conv, softmax, norms, losses, ...), an ``nn`` layer, ``@``, the reference ``Model`` or numpy |
| ``try_except_fallback`` | an ``except`` handler computes with torch, numpy or the reference ``Model`` |
| ``other_compiler`` | ``torch.compile``, ``torch.jit``, dynamo/inductor/export/fx, jiterator, another kernel compiler (numba, cupy, jax, tvm, ...), or the other backend's compiler |
| ``monkeypatch`` | assignment/``setattr``/``del`` on an imported module or the reference ``Model``, ``__builtins__``, aten overrides through ``torch.library``, torch function/dispatch modes |
| ``forbidden_module`` | threads, processes, ctypes, sockets/HTTP, files, timers, ``gc``/``inspect``/``sys``/``importlib``, profilers, the harness; ``os`` beyond ``environ``/``getenv``; ``torch.save``/``torch.load`` |
| ``forbidden_builtin`` | ``open``, ``exec``, ``eval``, ``compile``, ``__import__``, ``globals``/``locals``/``vars``, ``breakpoint``, ``input``, ``getattr``/``setattr``/``hasattr``/``delattr`` with a computed name, frame and dunder introspection |
| ``side_stream`` | a CUDA stream is created or made current (``torch.cuda.Stream``/``stream``/``set_stream``, ``cudaStreamCreate*``, ``getStreamFromPool``) |
| ``output_caching`` | the forward path stores a value derived from its inputs where it outlives the call (``self`` attributes, globals, module-level or default-argument containers), or memoises with ``functools.cache``/``lru_cache`` |
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from kernelrl.env.parse import (
    cpp_extension_sources,
    cuda_global_functions,
    dotted_name,
    import_aliases,
    is_cpp_extension_call,
    strip_c_comments,
    triton_kernels,
)


@dataclass(frozen=True)
class CheckFailure:
    """One violated rule, with a message written for the model that produced the solution."""

    name: str
    message: str
    lineno: int | None = None

    def __str__(self) -> str:
        where = f" (line {self.lineno})" if self.lineno else ""
        return f"[{self.name}]{where} {self.message}"


# ----------------------------------------------------------------------------- op vocabulary
# Calls that allocate, reshape or describe tensors: never "the computation".
ALLOWED_TORCH_OPS = frozenset(
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
        "as_strided",
        "contiguous",
        "view",
        "view_as",
        "reshape",
        "reshape_as",
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
        "chunk",
        "stride",
        "size",
        "numel",
        "dim",
        "element_size",
        "data_ptr",
        "is_contiguous",
        "to",
        "float",
        "half",
        "bfloat16",
        "double",
        "int",
        "long",
        "bool",
        "type",
        "cuda",
        "cpu",
        "detach",
        "requires_grad_",
        "new_empty",
        "new_zeros",
        "new_ones",
        "new_full",
        "new_tensor",
        "get_device",
        "is_floating_point",
        "device",
        "Size",
        "finfo",
        "iinfo",
        "dtype",
        "manual_seed",
        "is_tensor",
        "result_type",
        "promote_types",
        "broadcast_shapes",
        "storage_offset",
        "untyped_storage",
        "movedim",
        "swapaxes",
        "swapdims",
        "item",
        "tolist",
    ]
)
# Ops that do real work in any task, whether or not the reference names them.
HEAVY_TORCH_OPS = frozenset(
    [
        "matmul",
        "mm",
        "bmm",
        "addmm",
        "addbmm",
        "baddbmm",
        "addmv",
        "mv",
        "dot",
        "einsum",
        "tensordot",
        "linear",
        "bilinear",
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
        "convolution",
        "softmax",
        "log_softmax",
        "softmin",
        "layer_norm",
        "group_norm",
        "batch_norm",
        "instance_norm",
        "rms_norm",
        "local_response_norm",
        "normalize",
        "cross_entropy",
        "nll_loss",
        "mse_loss",
        "l1_loss",
        "smooth_l1_loss",
        "huber_loss",
        "kl_div",
        "binary_cross_entropy",
        "binary_cross_entropy_with_logits",
        "cosine_similarity",
        "scaled_dot_product_attention",
        "multi_head_attention_forward",
        "cumsum",
        "cumprod",
        "logcumsumexp",
        "sort",
        "argsort",
        "topk",
        "kthvalue",
        "fft",
        "ifft",
        "rfft",
        "irfft",
        "max_pool1d",
        "max_pool2d",
        "max_pool3d",
        "avg_pool1d",
        "avg_pool2d",
        "avg_pool3d",
        "adaptive_avg_pool2d",
        "adaptive_max_pool2d",
        "interpolate",
        "embedding",
        "unfold",
        "fold",
        "pad",
        "logsumexp",
        "cdist",
    ]
)
# nn layers that hold no computation worth a kernel.
PASSIVE_LAYERS = frozenset(
    {
        "Identity",
        "Dropout",
        "Flatten",
        "Unflatten",
        "ModuleList",
        "ModuleDict",
        "Sequential",
        "ParameterList",
        "ParameterDict",
    }
)
TORCH_NAMESPACES = (
    "torch.",
    "torch.nn.functional.",
    "torch.special.",
    "torch.linalg.",
    "torch.fft.",
    "torch.ops.aten.",
)

OTHER_COMPILER_PREFIXES = (
    "torch.compile",
    "torch.jit",
    "torch._dynamo",
    "torch._inductor",
    "torch.export",
    "torch.fx",
    "torch.cuda.jiterator",
    "torch._C._jit",
)
OTHER_COMPILER_MODULES = frozenset(
    [
        "numba",
        "cupy",
        "jax",
        "jaxlib",
        "tvm",
        "tensorflow",
        "pycuda",
        "taichi",
        "tilelang",
        "tensorrt",
        "torch_tensorrt",
        "onnxruntime",
        "iree",
        "hidet",
        "cuda",
        "cutlass",
        "thunder",
        "mlir",
        "nvrtc",
    ]
)
FORBIDDEN_MODULES = frozenset(
    [
        "threading",
        "_thread",
        "multiprocessing",
        "concurrent",
        "subprocess",
        "ctypes",
        "cffi",
        "socket",
        "ssl",
        "http",
        "urllib",
        "urllib3",
        "requests",
        "httpx",
        "aiohttp",
        "ftplib",
        "smtplib",
        "asyncio",
        "signal",
        "gc",
        "inspect",
        "sys",
        "shutil",
        "tempfile",
        "pickle",
        "dill",
        "cloudpickle",
        "marshal",
        "shelve",
        "importlib",
        "builtins",
        "time",
        "timeit",
        "resource",
        "mmap",
        "faulthandler",
        "atexit",
        "traceback",
        "pty",
        "select",
        "selectors",
        "sqlite3",
        "kernelrl",
        "pathlib",
        "glob",
        "fcntl",
        "psutil",
        "code",
        "pdb",
        "runpy",
        "io",
        "posix",
    ]
)
FORBIDDEN_TORCH_APIS = (
    "torch.profiler",
    "torch.autograd.profiler",
    "torch.cuda.profiler",
    "torch._C",
    "torch.multiprocessing",
    "torch.save",
    "torch.load",
    "torch.hub",
    "torch.utils.data",
    "numpy.save",
    "numpy.load",
    "numpy.fromfile",
)
OS_ALLOWED = frozenset({"os.environ", "os.getenv"})
FORBIDDEN_BUILTINS = frozenset(
    [
        "open",
        "exec",
        "eval",
        "compile",
        "__import__",
        "globals",
        "locals",
        "vars",
        "breakpoint",
        "input",
    ]
)
INTROSPECTION_ATTRIBUTES = frozenset(
    [
        "__dict__",
        "__globals__",
        "__code__",
        "__closure__",
        "__subclasses__",
        "__bases__",
        "__mro__",
        "__builtins__",
        "__getattribute__",
        "__loader__",
        "__spec__",
        "f_back",
        "f_globals",
        "f_locals",
        "f_code",
        "gi_frame",
        "cr_frame",
        "tb_frame",
        "__self__",
        "__func__",
        "__wrapped__",
    ]
)
NAME_TAKING_BUILTINS = frozenset({"getattr", "setattr", "delattr", "hasattr"})
SIDE_STREAM_CALLS = frozenset(
    {
        "torch.cuda.Stream",
        "torch.cuda.stream",
        "torch.cuda.set_stream",
        "torch.cuda.ExternalStream",
        "torch.cuda.StreamContext",
        "torch.cuda.streams.Stream",
        "torch.Stream",
        "torch.cuda.Stream.wait_stream",
    }
)
SIDE_STREAM_CUDA = re.compile(
    r"\b(cudaStreamCreate\w*|cuStreamCreate\w*|getStreamFromPool|cudaStreamPerThread"
    r"|cudaStreamNonBlocking|setCurrentCUDAStream)\b"
)
DISPATCH_HOOKS = frozenset({"__torch_function__", "__torch_dispatch__"})
DISPATCH_MODULES = ("torch.overrides", "torch.utils._python_dispatch", "torch._subclasses")
MEMO_DECORATORS = frozenset({"functools.cache", "functools.lru_cache", "functools.cached_property"})

_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")
_LAYER_OPS = {
    "Linear": "linear",
    "Bilinear": "bilinear",
    "LazyLinear": "linear",
    "Embedding": "embedding",
    "CrossEntropyLoss": "cross_entropy",
    "NLLLoss": "nll_loss",
    "MSELoss": "mse_loss",
    "L1Loss": "l1_loss",
    "KLDivLoss": "kl_div",
    "BCELoss": "binary_cross_entropy",
    "BCEWithLogitsLoss": "binary_cross_entropy_with_logits",
    "SmoothL1Loss": "smooth_l1_loss",
    "HuberLoss": "huber_loss",
    "LogSoftmax": "log_softmax",
    "RMSNorm": "rms_norm",
    "GELU": "gelu",
    "SiLU": "silu",
    "ReLU": "relu",
    "ReLU6": "relu6",
    "ELU": "elu",
    "SELU": "selu",
    "PReLU": "prelu",
    "MultiheadAttention": "multi_head_attention_forward",
}


def layer_op(class_name: str) -> str:
    """``nn.Conv2d`` -> ``conv2d``, ``nn.BatchNorm2d`` -> ``batch_norm``: the functional op a
    layer runs, so a reference written with layers and a solution calling ``F.*`` meet."""
    if class_name in _LAYER_OPS:
        return _LAYER_OPS[class_name]
    name = _CAMEL.sub("_", class_name).lower()
    name = re.sub(r"_?(\d)_?d$", r"\1d", name)  # conv_2d / conv2_d -> conv2d
    if name.endswith("norm") or re.search(r"norm\dd$", name):
        name = re.sub(r"norm\dd$", "norm", name)
    return name.replace("_transpose", "_transpose")


def torch_op(name: str | None) -> str | None:
    """``torch.nn.functional.softmax`` -> ``softmax``; ``None`` for anything outside torch."""
    if name is None:
        return None
    for prefix in TORCH_NAMESPACES[::-1]:
        if name.startswith(prefix):
            op = name[len(prefix) :]
            if "." in op:  # torch.ops.aten.mm.default, torch.Tensor.add
                parts = op.split(".")
                op = parts[0] if parts[0] != "Tensor" else parts[-1]
            return op.rstrip("_")
    return None


# ----------------------------------------------------------------------------- analysis
class SolutionAnalysis:
    """Everything the checks share, computed once: aliases, kernels, classes, forward path."""

    def __init__(self, source: str, backend: str) -> None:
        self.tree = ast.parse(source)
        self.backend = backend
        self.aliases = import_aliases(self.tree)
        self.kernels = triton_kernels(self.tree, self.aliases)
        self.kernel_defs = {
            node
            for node in ast.walk(self.tree)
            if isinstance(node, ast.FunctionDef) and node.name in set(self.kernels.values())
        }
        self.functions = {
            n.name: n
            for n in self.tree.body
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        self.classes = {n.name: n for n in self.tree.body if isinstance(n, ast.ClassDef)}
        self.methods: dict[str, list[ast.FunctionDef]] = {}
        for cls in self.classes.values():
            for item in cls.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    self.methods.setdefault(item.name, []).append(item)
        self.attribute_types = self._attribute_types()
        self.extension_names, self.loader_functions = self._cpp_extension_bindings()
        self.forward = self._method("ModelNew", "forward")
        self.forward_path = self._reachable(self.forward) if self.forward else []

    def resolve(self, node: ast.AST) -> str | None:
        return dotted_name(node, self.aliases)

    def _method(self, class_name: str, method: str) -> ast.FunctionDef | None:
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

    def _attribute_types(self) -> dict[str, str]:
        """``self.x = Something(...)`` anywhere -> ``{"x": "Something" or "torch.nn.Conv2d"}``."""
        types: dict[str, str] = {}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                callee = node.value.func
                name = (
                    callee.id
                    if isinstance(callee, ast.Name) and callee.id in self.classes
                    else self.resolve(callee)
                )
                for target in node.targets:
                    if _is_self_attribute(target) and name:
                        types[target.attr] = name  # type: ignore[union-attr]
        return types

    def _cpp_extension_bindings(self) -> tuple[set[str], set[str]]:
        """Names and ``self`` attributes bound to a ``load_inline`` result, and functions that
        return one (lazy loaders)."""
        names: set[str] = set()
        loaders: set[str] = set()
        for fn in self.functions.values():
            for node in ast.walk(fn):
                if (
                    isinstance(node, ast.Return)
                    and node.value is not None
                    and is_cpp_extension_call(node.value, self.aliases)
                ):
                    loaders.add(fn.name)
        changed = True
        while changed:
            changed = False
            for node in ast.walk(self.tree):
                if not isinstance(node, ast.Assign):
                    continue
                value = node.value
                bound = (
                    is_cpp_extension_call(value, self.aliases)
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
                        if _is_self_attribute(target)
                        else None
                    )
                    if key and key not in names:
                        names.add(key)
                        changed = True
            for fn in self.functions.values():
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

    def is_extension(self, owner: ast.AST) -> bool:
        """``ext``, ``self.ext`` or ``load_ext()``: an object whose methods are the solution's
        compiled CUDA functions."""
        if isinstance(owner, ast.Name):
            return owner.id in self.extension_names
        if _is_self_attribute(owner):
            return owner.attr in self.extension_names  # type: ignore[union-attr]
        return (
            isinstance(owner, ast.Call)
            and isinstance(owner.func, ast.Name)
            and owner.func.id in self.loader_functions
        )

    def _callees(self, call: ast.Call) -> Iterator[ast.FunctionDef]:
        func = call.func
        if isinstance(func, ast.Name):
            if func.id in self.functions:
                yield self.functions[func.id]
            elif func.id in self.classes:
                for method in ("__init__", "forward", "__call__"):
                    found = self._method(func.id, method)
                    if found:
                        yield found
        elif isinstance(func, ast.Attribute):
            if _is_self_attribute(func) and self.attribute_types.get(func.attr) in self.classes:
                for method in ("forward", "__call__"):
                    found = self._method(self.attribute_types[func.attr], method)
                    if found:
                        yield found
            if (
                func.attr == "apply"
                and isinstance(func.value, ast.Name)
                and func.value.id in self.classes
            ):
                found = self._method(func.value.id, "forward")
                if found:
                    yield found
            yield from self.methods.get(func.attr, [])
        for argument in call.args:  # functions passed as callbacks (e.g. to a launcher helper)
            if isinstance(argument, ast.Name) and argument.id in self.functions:
                yield self.functions[argument.id]

    def _reachable(self, start: ast.FunctionDef) -> list[ast.FunctionDef]:
        seen: dict[int, ast.FunctionDef] = {id(start): start}
        queue = [start]
        while queue:
            fn = queue.pop()
            for node in walk_skipping(fn, self.kernel_defs):
                if isinstance(node, ast.Call):
                    for callee in self._callees(node):
                        if id(callee) not in seen and callee not in self.kernel_defs:
                            seen[id(callee)] = callee
                            queue.append(callee)
        return list(seen.values())

    def forward_nodes(self) -> Iterator[ast.AST]:
        for fn in self.forward_path:
            yield from walk_skipping(fn, self.kernel_defs)


def walk_skipping(root: ast.AST, skip: set[ast.FunctionDef]) -> Iterator[ast.AST]:
    """``ast.walk`` that does not descend into kernel definitions (device code)."""
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(child for child in ast.iter_child_nodes(node) if child not in skip)


def _is_self_attribute(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def _root_name(node: ast.AST) -> ast.Name | None:
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node if isinstance(node, ast.Name) else None


def _module_of(name: str | None) -> str:
    return name.lstrip(".").split(".")[0] if name else ""


# ----------------------------------------------------------------------------- reference ops
def reference_ops(reference_source: str | None) -> set[str]:
    """The torch ops the reference's forward path uses (minus allocation and views)."""
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
        ops.update(_ops_of(node, analysis))
    return {op for op in ops if op not in ALLOWED_TORCH_OPS}


def _ops_of(node: ast.AST, analysis: SolutionAnalysis) -> Iterator[str]:
    """The torch op names one node performs, if any."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
        yield "matmul"
    if not isinstance(node, ast.Call):
        return
    func = node.func
    resolved = analysis.resolve(func)
    op = torch_op(resolved)
    if op:
        yield op
        return
    if _is_self_attribute(func) and func.attr in analysis.attribute_types:  # type: ignore[union-attr]
        layer = analysis.attribute_types[func.attr]  # type: ignore[union-attr]
        if layer.startswith("torch.nn.") and layer.rsplit(".", 1)[1] not in PASSIVE_LAYERS:
            yield layer_op(layer.rsplit(".", 1)[1])
        return
    if (
        isinstance(func, ast.Attribute)
        and resolved is None
        and not _is_self_attribute(func)
        and not analysis.is_extension(func.value)
    ):
        yield func.attr.rstrip("_")  # a tensor method, e.g. x.softmax(dim=1)


# ----------------------------------------------------------------------------- the checks
Check = Callable[[SolutionAnalysis, set[str]], list[CheckFailure]]


def check_no_custom_kernel(analysis: SolutionAnalysis, ref_ops: set[str]) -> list[CheckFailure]:
    if analysis.forward is None:
        return [
            CheckFailure(
                "no_custom_kernel", "ModelNew has no forward method, so no kernel can run."
            )
        ]
    if analysis.backend == "triton":
        if not analysis.kernels:
            return [
                CheckFailure(
                    "no_custom_kernel",
                    "No @triton.jit kernel is defined: write the computation as a Triton kernel.",
                )
            ]
        launched = False
        for node in analysis.forward_nodes():
            if isinstance(node, ast.Call):
                target = (
                    node.func.value
                    if isinstance(node.func, ast.Subscript | ast.Attribute)
                    else None
                )
                if isinstance(node.func, ast.Attribute) and node.func.attr not in ("run", "warmup"):
                    target = None
                name = (
                    target.id
                    if isinstance(target, ast.Name)
                    else target.attr
                    if isinstance(target, ast.Attribute)
                    else None
                )
                launched |= name in analysis.kernels
        if not launched:
            return [
                CheckFailure(
                    "no_custom_kernel",
                    f"Triton kernels are defined ({', '.join(sorted(set(analysis.kernels.values())))}) but none is "
                    "launched as kernel[grid](...) from ModelNew.forward.",
                    analysis.forward.lineno,
                )
            ]
        return []
    kernels = [
        name
        for _, sources in cpp_extension_sources(analysis.tree, analysis.aliases)
        for fragments in sources.values()
        for text, _ in fragments
        for name in cuda_global_functions(text)
    ]
    if not kernels:
        return [
            CheckFailure(
                "no_custom_kernel",
                "No __global__ CUDA kernel is passed to load_inline: write the computation as a CUDA kernel.",
            )
        ]
    for node in analysis.forward_nodes():
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and analysis.is_extension(node.func.value)
        ):
            return []
    return [
        CheckFailure(
            "no_custom_kernel",
            "CUDA kernels are compiled with load_inline but ModelNew.forward never calls the extension.",
            analysis.forward.lineno,
        )
    ]


def check_torch_fallback(analysis: SolutionAnalysis, ref_ops: set[str]) -> list[CheckFailure]:
    failures = []
    watched = (ref_ops | HEAVY_TORCH_OPS) - ALLOWED_TORCH_OPS
    for node in analysis.forward_nodes():
        if isinstance(node, ast.Call):
            resolved = analysis.resolve(node.func)
            if resolved and _module_of(resolved) == "numpy":
                failures.append(
                    CheckFailure(
                        "torch_fallback",
                        f"forward computes with numpy ({resolved}) instead of a kernel.",
                        node.lineno,
                    )
                )
                continue
            if (
                isinstance(node.func, ast.Name)
                and node.func.id == "Model"
                or (
                    isinstance(node.func, ast.Attribute)
                    and node.func.attr == "forward"
                    and isinstance(node.func.value, ast.Call)
                    and isinstance(node.func.value.func, ast.Name)
                    and node.func.value.func.id == "super"
                )
            ):
                failures.append(
                    CheckFailure(
                        "torch_fallback",
                        "forward runs the reference Model instead of a kernel.",
                        node.lineno,
                    )
                )
                continue
            if _is_self_attribute(node.func) and node.func.attr in analysis.attribute_types:  # type: ignore[union-attr]
                layer = analysis.attribute_types[node.func.attr]  # type: ignore[union-attr]
                short = layer.rsplit(".", 1)[-1]
                if layer.startswith("torch.nn.") and short not in PASSIVE_LAYERS:
                    failures.append(
                        CheckFailure(
                            "torch_fallback",
                            f"forward calls the PyTorch layer self.{node.func.attr} (nn.{short}); read its weights and compute in your kernel.",  # type: ignore[union-attr]
                            node.lineno,
                        )
                    )
                    continue
        for op in _ops_of(node, analysis):
            if op in watched:
                failures.append(
                    CheckFailure(
                        "torch_fallback",
                        f"forward calls the PyTorch op '{op}', which does the task's computation; compute it in your kernel.",
                        getattr(node, "lineno", None),
                    )
                )
    return failures


def check_try_except_fallback(analysis: SolutionAnalysis, ref_ops: set[str]) -> list[CheckFailure]:
    failures = []
    for node in ast.walk(analysis.tree):
        if not isinstance(node, ast.Try | ast.TryStar):
            continue
        for handler in node.handlers:
            for inner in ast.walk(handler):
                computes = any(op not in ALLOWED_TORCH_OPS for op in _ops_of(inner, analysis))
                resolved = analysis.resolve(inner.func) if isinstance(inner, ast.Call) else None
                if isinstance(inner, ast.Call) and (
                    _module_of(resolved) == "numpy"
                    or (isinstance(inner.func, ast.Name) and inner.func.id == "Model")
                ):
                    computes = True
                if computes and not (isinstance(inner, ast.Call) and _is_raise_helper(inner)):
                    failures.append(
                        CheckFailure(
                            "try_except_fallback",
                            "an except handler computes the result with PyTorch when the kernel fails; "
                            "let errors propagate instead of falling back.",
                            handler.lineno,
                        )
                    )
                    break
    return failures


def _is_raise_helper(call: ast.Call) -> bool:
    return isinstance(call.func, ast.Name) and call.func.id in {
        "RuntimeError",
        "ValueError",
        "TypeError",
        "str",
        "repr",
        "print",
        "format",
    }


def check_other_compiler(analysis: SolutionAnalysis, ref_ops: set[str]) -> list[CheckFailure]:
    failures = []
    for node in ast.walk(analysis.tree):
        names: list[tuple[str, int]] = []
        if isinstance(node, ast.Import):
            names = [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [(f"{node.module}.{alias.name}", node.lineno) for alias in node.names]
        elif isinstance(node, ast.Attribute | ast.Name) and isinstance(
            getattr(node, "ctx", None), ast.Load
        ):
            resolved = analysis.resolve(node)
            if resolved and any(
                resolved == p or resolved.startswith(p + ".") for p in OTHER_COMPILER_PREFIXES
            ):
                names = [(resolved, node.lineno)]
        for name, lineno in names:
            if _module_of(name) in OTHER_COMPILER_MODULES or any(
                name == p or name.startswith(p + ".") for p in OTHER_COMPILER_PREFIXES
            ):
                failures.append(
                    CheckFailure(
                        "other_compiler",
                        f"{name} stands in for a hand-written kernel; write the kernel yourself.",
                        lineno,
                    )
                )
    if analysis.backend == "triton" and cpp_extension_sources(analysis.tree, analysis.aliases):
        failures.append(
            CheckFailure(
                "other_compiler",
                "this task asks for Triton kernels, but the solution compiles C++/CUDA with torch.utils.cpp_extension.",
            )
        )
    if analysis.backend == "cuda" and analysis.kernels:
        failures.append(
            CheckFailure(
                "other_compiler",
                "this task asks for CUDA C++ kernels (load_inline), but the solution defines Triton kernels.",
            )
        )
    return _dedup(failures)


def check_monkeypatch(analysis: SolutionAnalysis, ref_ops: set[str]) -> list[CheckFailure]:
    failures = []

    def patched(target: ast.AST) -> bool:
        if isinstance(target, ast.Name):
            return target.id in ("__builtins__", "Model")
        root = _root_name(target)
        return (
            root is not None
            and isinstance(target, ast.Attribute | ast.Subscript)
            and (root.id in analysis.aliases or root.id in ("Model", "__builtins__"))
        )

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
        for target in _flatten_targets(targets):
            if patched(target):
                what = ast.unparse(target).replace(".?", "")
                failures.append(
                    CheckFailure(
                        "monkeypatch",
                        f"the solution modifies {what}; it must not patch torch, builtins, timers or the harness.",
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
    return _dedup(failures)


def _flatten_targets(targets: list[ast.AST]) -> Iterator[ast.AST]:
    for target in targets:
        if isinstance(target, ast.Tuple | ast.List):
            yield from _flatten_targets(list(target.elts))
        elif isinstance(target, ast.Starred):
            yield from _flatten_targets([target.value])
        else:
            yield target


def check_forbidden_module(analysis: SolutionAnalysis, ref_ops: set[str]) -> list[CheckFailure]:
    failures = []
    for node in ast.walk(analysis.tree):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            modules = ["." * node.level + (node.module or "")]
            if node.module == "os" and not node.level:
                modules = [f"os.{alias.name}" for alias in node.names]
        for module in modules:
            if (
                module.startswith(".")
                or _module_of(module) in FORBIDDEN_MODULES
                or (module.startswith("os.") and module not in OS_ALLOWED)
                or module.startswith(FORBIDDEN_TORCH_APIS)
            ):
                failures.append(
                    CheckFailure(
                        "forbidden_module",
                        f"import of {module.lstrip('.') or 'a relative module'} is not allowed in a solution (threads, processes, I/O, timers, introspection).",
                        node.lineno,
                    )
                )
        if isinstance(node, ast.Attribute | ast.Name) and isinstance(
            getattr(node, "ctx", None), ast.Load
        ):
            resolved = analysis.resolve(node)
            if not resolved or isinstance(node, ast.Name):
                continue
            if (
                _module_of(resolved) == "os"
                and resolved.count(".") == 1
                and resolved not in OS_ALLOWED
            ) or (resolved.startswith(FORBIDDEN_TORCH_APIS) and resolved.count(".") <= 3):
                failures.append(
                    CheckFailure(
                        "forbidden_module",
                        f"{resolved} (process, file or profiler access) is not allowed in a solution.",
                        node.lineno,
                    )
                )
    return _dedup(failures)


def check_forbidden_builtin(analysis: SolutionAnalysis, ref_ops: set[str]) -> list[CheckFailure]:
    failures = []
    for node in ast.walk(analysis.tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id not in analysis.aliases
        ):
            name = node.func.id
            if name in FORBIDDEN_BUILTINS and name not in analysis.functions:
                failures.append(
                    CheckFailure(
                        "forbidden_builtin",
                        f"the builtin {name}() is not allowed in a solution.",
                        node.lineno,
                    )
                )
            elif name in NAME_TAKING_BUILTINS and (
                len(node.args) < 2 or not isinstance(node.args[1], ast.Constant)
            ):
                failures.append(
                    CheckFailure(
                        "forbidden_builtin",
                        f"{name}() with a computed attribute name hides what is accessed; use plain attribute access.",
                        node.lineno,
                    )
                )
        elif isinstance(node, ast.Attribute) and node.attr in INTROSPECTION_ATTRIBUTES:
            failures.append(
                CheckFailure(
                    "forbidden_builtin",
                    f"introspection through .{node.attr} is not allowed in a solution.",
                    node.lineno,
                )
            )
        elif isinstance(node, ast.Name) and node.id in ("__builtins__", "__loader__", "__spec__"):
            failures.append(
                CheckFailure(
                    "forbidden_builtin", f"{node.id} is not allowed in a solution.", node.lineno
                )
            )
    return _dedup(failures)


def check_side_stream(analysis: SolutionAnalysis, ref_ops: set[str]) -> list[CheckFailure]:
    failures = []
    for node in ast.walk(analysis.tree):
        if isinstance(node, ast.Attribute | ast.Name) and isinstance(
            getattr(node, "ctx", None), ast.Load
        ):
            resolved = analysis.resolve(node)
            if resolved in SIDE_STREAM_CALLS:
                failures.append(
                    CheckFailure(
                        "side_stream",
                        f"{resolved}: work must run on the current stream, where the harness times it.",
                        node.lineno,
                    )
                )
    for _, sources in cpp_extension_sources(analysis.tree, analysis.aliases):
        for fragments in sources.values():
            for text, lineno in fragments:
                match = SIDE_STREAM_CUDA.search(strip_c_comments(text))
                if match:
                    failures.append(
                        CheckFailure(
                            "side_stream",
                            f"{match.group(1)} in the CUDA source: launch on at::cuda::getCurrentCUDAStream().",
                            lineno,
                        )
                    )
    return _dedup(failures)


def check_output_caching(analysis: SolutionAnalysis, ref_ops: set[str]) -> list[CheckFailure]:
    failures = []
    module_names = {
        target.id
        for node in analysis.tree.body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for target in _flatten_targets(
            list(node.targets) if isinstance(node, ast.Assign) else [node.target]
        )
        if isinstance(target, ast.Name)
    }
    for fn in analysis.forward_path:
        for decorator in fn.decorator_list:
            name = analysis.resolve(
                decorator.func if isinstance(decorator, ast.Call) else decorator
            )
            if name in MEMO_DECORATORS:
                failures.append(
                    CheckFailure(
                        "output_caching",
                        f"{fn.name} is memoised with {name}: every call must compute its result.",
                        fn.lineno,
                    )
                )
        tainted = _tainted_names(fn)
        declared_global = {
            name
            for node in ast.walk(fn)
            if isinstance(node, ast.Global | ast.Nonlocal)
            for name in node.names
        }
        defaults = {
            arg.arg
            for arg, default in zip(fn.args.args[::-1], fn.args.defaults[::-1], strict=False)
            if isinstance(default, ast.Dict | ast.List | ast.Set)
        }
        for node in walk_skipping(fn, analysis.kernel_defs):
            stores: list[tuple[ast.AST, ast.AST]] = []
            if isinstance(node, ast.Assign):
                stores = [(t, node.value) for t in _flatten_targets(list(node.targets))]
            elif isinstance(node, ast.AugAssign | ast.AnnAssign) and node.value is not None:
                stores = [(node.target, node.value)]
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr
                in (
                    "append",
                    "extend",
                    "update",
                    "setdefault",
                    "__setitem__",
                    "insert",
                    "add",
                    "copy_",
                )
            ):
                stores = [(node.func.value, ast.Tuple(elts=list(node.args), ctx=ast.Load()))]
            for target, value in stores:
                if not _mentions(value, tainted):
                    continue
                root = _root_name(target)
                persistent = (
                    _is_self_attribute(target)
                    or (root is not None and root.id == "self" and not isinstance(target, ast.Name))
                    or (isinstance(target, ast.Name) and target.id in declared_global)
                    or (
                        root is not None
                        and not isinstance(target, ast.Name)
                        and (root.id in module_names or root.id in defaults)
                    )
                )
                if persistent:
                    failures.append(
                        CheckFailure(
                            "output_caching",
                            f"forward stores a value derived from its inputs in {ast.unparse(target)}, which outlives the call; "
                            "compute the output afresh on every call (allocate buffers per call or in __init__).",
                            node.lineno,
                        )
                    )
    return _dedup(failures)


def _tainted_names(fn: ast.FunctionDef) -> set[str]:
    """Parameters (except ``self``) and every local assigned from an expression using them."""
    arguments = fn.args
    tainted = {
        a.arg
        for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs
        if a.arg != "self"
    }
    tainted |= {a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None}
    for _ in range(3):  # assignments out of order (loops) converge in a few passes
        for node in ast.walk(fn):
            if isinstance(
                node,
                ast.Assign | ast.AugAssign | ast.AnnAssign | ast.For | ast.withitem | ast.NamedExpr,
            ):
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
                if value is not None and _mentions(value, tainted):
                    tainted |= {t.id for t in _flatten_targets(targets) if isinstance(t, ast.Name)}
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name) is False
                and _mentions(node, tainted)
            ):
                # out-parameter kernels: kernel[grid](x, out) writes into `out`
                for argument in node.args:
                    if isinstance(argument, ast.Name):
                        tainted.add(argument.id)
    return tainted


def _mentions(expr: ast.AST, names: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(expr))


def _dedup(failures: list[CheckFailure]) -> list[CheckFailure]:
    seen: set[tuple[str, str]] = set()
    unique = []
    for failure in failures:
        if (failure.name, failure.message) not in seen:
            seen.add((failure.name, failure.message))
            unique.append(failure)
    return unique


STATIC_CHECKS: dict[str, Check] = {
    "no_custom_kernel": check_no_custom_kernel,
    "torch_fallback": check_torch_fallback,
    "try_except_fallback": check_try_except_fallback,
    "other_compiler": check_other_compiler,
    "monkeypatch": check_monkeypatch,
    "forbidden_module": check_forbidden_module,
    "forbidden_builtin": check_forbidden_builtin,
    "side_stream": check_side_stream,
    "output_caching": check_output_caching,
}


def run_static_checks(
    solution_source: str, backend: str, reference_source: str | None = None
) -> list[CheckFailure]:
    """Every static check on one solution; ``[]`` means it may run.

    ``reference_source`` (the task's PyTorch code) tells ``torch_fallback`` which ops are the
    task's computation. Unparseable source is not judged here: the sandbox reports it as a
    compile error with Python's own message.
    """
    if backend not in ("triton", "cuda"):
        raise ValueError(f"backend must be 'triton' or 'cuda', got {backend!r}")
    try:
        analysis = SolutionAnalysis(solution_source, backend)
    except (SyntaxError, ValueError):
        return []
    ref_ops = reference_ops(reference_source)
    failures: list[CheckFailure] = []
    for check in STATIC_CHECKS.values():
        failures.extend(check(analysis, ref_ops))
    return failures
