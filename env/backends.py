"""The kernel languages a task can ask for, each one object registered here.

Everything that differs between Triton and CUDA C++ solutions is an attribute of its
``Backend``: how to find the kernels a solution defines, what a launch of one looks like in
``forward``, whether the sandbox counts launches itself (Triton's launcher hook) or only the
profiler sees them (``load_inline`` extensions). Code elsewhere asks the task's backend instead
of comparing its name, so a third language is one more entry in ``BACKENDS``.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kernelrl.env.parse import (
    cpp_extension_sources,
    cuda_global_functions,
    import_aliases,
    triton_kernels,
)
from kernelrl.env.python_syntax import parse_python

Aliases = dict[str, str]


@dataclass(frozen=True)
class Backend:
    name: str
    display_name: str
    kernel_form: str  # what one of its kernels is, for messages
    launch_form: str  # how forward launches one, for messages
    # True: the sandbox counts the solution's own launches per call (a forward call that
    # launches none is caught there); False: only the profiler of a timed call sees them.
    counts_launches: bool
    # The kernels a solution defines, by the names the profiler shows.
    find_kernels: Callable[[ast.Module, Aliases], list[str]]
    # The names to look for among profiler rows: ``find_kernels`` or, where a backend's
    # kernels can be built in ways the parser does not follow, a superset.
    profiled_names: Callable[[ast.Module, Aliases], list[str]]
    # Whether the solution uses this language at all (a Triton task that compiles C++ does).
    used_by: Callable[[ast.Module, Aliases], bool]
    # Whether ``call`` (in forward) launches one of the solution's kernels; ``analysis`` is the
    # integrity layer's SolutionAnalysis of the solution.
    launches: Callable[[Any, ast.Call], bool]


def _triton_kernels(tree: ast.Module, aliases: Aliases) -> list[str]:
    return list(dict.fromkeys(triton_kernels(tree, aliases).values()))


def _cuda_kernels(tree: ast.Module, aliases: Aliases) -> list[str]:
    return list(
        dict.fromkeys(
            name
            for _, sources in cpp_extension_sources(tree, aliases)
            for fragments in sources.values()
            for text, _ in fragments
            for name in cuda_global_functions(text)
        )
    )


def _cuda_profiled_names(tree: ast.Module, aliases: Aliases) -> list[str]:
    """The kernels passed to ``load_inline``, else the ``__global__`` functions of any string
    literal: names only match profiler rows, so a superset does no harm."""
    names = _cuda_kernels(tree, aliases)
    if not names:
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.extend(cuda_global_functions(node.value))
    return list(dict.fromkeys(names))


def _calls_extension(analysis: Any, call: ast.Call) -> bool:
    return isinstance(call.func, ast.Attribute) and analysis.is_extension(call.func.value)


TRITON = Backend(
    name="triton",
    display_name="Triton",
    kernel_form="@triton.jit kernel",
    launch_form="as kernel[grid](...)",
    counts_launches=True,
    find_kernels=_triton_kernels,
    profiled_names=_triton_kernels,
    used_by=lambda tree, aliases: bool(triton_kernels(tree, aliases)),
    launches=lambda analysis, call: analysis.launches_kernel(call),
)
CUDA = Backend(
    name="cuda",
    display_name="CUDA",
    kernel_form="__global__ CUDA kernel passed to load_inline",
    launch_form="through the compiled extension (ext.fn(...))",
    counts_launches=False,
    find_kernels=_cuda_kernels,
    profiled_names=_cuda_profiled_names,
    used_by=lambda tree, aliases: bool(cpp_extension_sources(tree, aliases)),
    launches=_calls_extension,
)
BACKENDS: dict[str, Backend] = {b.name: b for b in (TRITON, CUDA)}


def get_backend(name: str) -> Backend:
    """The registered backend called ``name``; anything else is a clear ValueError."""
    try:
        return BACKENDS[name]
    except (KeyError, TypeError):
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {name!r}") from None


def solution_kernel_names(source: str, backend: str) -> list[str]:
    """Names of the kernels the solution defines, as the profiler will show them (``[]`` for
    unparseable source)."""
    spec = get_backend(backend)
    try:
        tree = parse_python(source)
    except (SyntaxError, ValueError):
        return []
    return spec.profiled_names(tree, import_aliases(tree))
