"""Static integrity checks: reward hacks that can be seen in the solution's AST before it runs.

Every check has a name (the status detail an EvalResult carries in ``checks_failed``), one precise
rule, and tests with a hacking solution it catches and a legitimate near-miss it passes
(``tests/solutions/static/``). The dynamic checks (``dynamic_checks`` and the sandbox's runtime
op audit) back them up at run time, so obfuscation that slips past the AST is still caught.

The rules are allow-lists wherever a deny-list could be outgrown: torch is compute unless
``vocabulary`` calls the name glue, so a new, private or renamed op is compute by default. Names
are resolved through imports, assignments (``f = torch.nansum``), ``getattr`` with a
constant-folded name, ``importlib``/``__import__`` and ``functools.partial``; a ``getattr`` whose
name cannot be folded is itself a violation, because it hides what is reached.

The *forward path* is every function reachable from ``ModelNew.forward`` (and ``__call__``,
forward hooks) through the functions, methods, lambdas and classes the solution defines (kernel
bodies excluded: they are device code).

| check | rule |
| --- | --- |
| ``unknown_api`` | (not a hack: said as ``compile_error``) an attribute that no value a solution works with has and that the solution does not define, on a value whose type is not known |
| ``undefined_name`` | (not a hack: said as ``compile_error``) a name that is neither bound by the solution nor a Python builtin (nor a dunder): a NameError if it ran |
| ``unlisted_reference`` | anywhere in the module (kernels, ``__init__`` and module level included), a name, attribute chain, import, builtin, base class, dunder definition or hook keyword that is not on the allow-list (``allowed``): reflection, the harness and any module not listed are out of reach by every spelling |
| ``no_custom_kernel`` | no kernel of the task's backend is defined, or none is launched on the forward path (directly, through a dispatch table, a variable holding a kernel, or ``wrap_triton(kernel)[grid]``; the body of an op the solution registers with ``torch.library.triton_op``/``custom_op`` is on the forward path, called by name or as ``torch.ops.ns.name``) |
| ``torch_fallback`` | code that runs outside construction (every function, method and lambda not reached only from ``__init__``; module level, class bodies, decorators) calls or references torch compute, or, at module level and in class bodies, applies an operator to a tensor (``TABLE = (codes / 256) ** 2``) (anything outside the glue vocabulary: ``torch.*``, ``F.*``, ``torch.ops.*`` except the solution's own registered ops, ``torch._C.*``, tensor methods), an ``nn`` layer, ``@``, the reference ``Model`` or numpy; or, when the reference only moves data (every op it runs is glue: a ``cat``, a broadcasting ``copy_``, ``permute`` + ``contiguous``), a copying glue op the reference itself uses. Elsewhere casts and layout copies around the solution's kernel are glue: they cost runtime, which is measured (the dynamic ``glue_budget`` limits torch copies by the same rule: only in a data-movement task, bytes copied per call and share of GPU time) |
| ``try_except_fallback`` | an ``except`` handler computes with torch, numpy or the reference ``Model`` |
| ``other_compiler`` | ``torch.compile``, ``torch.jit``, dynamo/inductor/export/fx, jiterator, another kernel compiler (numba, cupy, jax, tvm, ...), or the other backend's compiler |
| ``monkeypatch`` | assignment/``setattr``/``del`` on a module (however reached) or the reference ``Model``, ``__builtins__``, aten overrides through ``torch.library``, torch function/dispatch modes |
| ``forbidden_module`` | threads, processes, ctypes, sockets/HTTP, files, timers, ``gc``/``inspect``/``sys``/``importlib``, profilers, the harness; ``os`` beyond ``environ``/``getenv``; ``torch.save``/``torch.load``; any of these reached as an attribute of another module (``torch.os``, ``torch._C``, ``triton.runtime.driver``, ``np.ctypeslib``) |
| ``forbidden_builtin`` | ``open``, ``exec``, ``eval``, ``compile``, ``__import__``, ``globals``/``locals``/``vars``, ``breakpoint``, ``input`` (called or referenced); ``getattr``/``setattr``/``delattr``/``hasattr`` with a name that cannot be folded to a constant; dunder, frame and traceback introspection |
| ``global_state`` | anywhere in the module, a reference to something that changes torch's process-wide state: a setter of torch or of one of its modules (``torch.set_default_dtype``, ``torch.use_deterministic_algorithms``, ``torch.set_flush_denormal``, ``torch.cuda.set_device``; not ``set_printoptions``, ``set_grad_enabled``), or anything under ``torch.backends`` (``allow_tf32``); the sandbox makes inputs and reads outputs under that state |
| ``host_compute`` | in a compiled extension's source, host code reaching device data: a copy toward the host (``cudaMemcpyDeviceToHost``, ``cudaMemcpyDefault``, ``cudaMemcpyFromSymbol``, ``cuMemcpyDtoH``) or one whose direction the call does not name as host-to-device or device-to-device, memory both sides map (``cudaHostAlloc``, ``cudaMallocManaged``, ``__managed__``), CPU tensors (``.cpu()``, ``kCPU``, ``accessor``), names looked up or pasted at run time (``dlsym``, ``##``); in a CUDA solution's Python, ``.cpu()``, ``pin_memory`` or the device ``"cpu"`` |
| ``side_stream`` | a CUDA stream is created or made current (``torch.cuda.Stream``/``stream``/``set_stream``, ``cudaStreamCreate*``, ``getStreamFromPool``) |
| ``output_caching`` | the forward path (helpers included) stores where it outlives the call (``self`` attributes, globals, module-level or default-argument containers) a value computed from its inputs' data, or a buffer after a launch given the inputs wrote into it; memoises with ``functools.cache``/``lru_cache`` a function called with data (a tensor, its values or address) or passed uncalled, or uses ``cached_property``; or returns a persistent buffer (directly, as a view, or from a helper). Metadata (shape, dtype, device, numel, strides), allocations sized from it (``empty``, ``empty_like``, ``new_empty``, ``zeros``) and objects of the solution's own classes built only from it (a launch plan) are not data: launch configs, plans and scratch buffers may be cached by shape and reused while not returned; a returned or stale buffer is also caught by behaviour (``output_reused``, fresh inputs on every call) |
| ``jit_global`` | a ``@triton.jit`` function reads a module global that is not a ``tl.constexpr``, a module or a jit function: it runs under the CPU interpreter but fails to compile on a GPU |
"""

from __future__ import annotations

from collections.abc import Callable

from kernelrl.env.backends import get_backend
from kernelrl.env.integrity.analysis import SolutionAnalysis
from kernelrl.env.integrity.compute_checks import (
    check_no_custom_kernel,
    check_torch_fallback,
    check_try_except_fallback,
    reference_ops,
)
from kernelrl.env.integrity.failure import CheckFailure
from kernelrl.env.integrity.reach_checks import (
    check_forbidden_builtin,
    check_forbidden_module,
    check_global_state,
    check_host_compute,
    check_monkeypatch,
    check_other_compiler,
    check_side_stream,
)
from kernelrl.env.integrity.reference_checks import (
    UNDEFINED_NAME,
    UNKNOWN_API,
    check_unlisted_reference,
)
from kernelrl.env.integrity.state_checks import check_jit_global, check_output_caching

Check = Callable[[SolutionAnalysis, set[str]], list[CheckFailure]]

# Failures that are mistakes rather than hacks: the evaluator says them as a compile error.
NOT_HACKS = frozenset({UNKNOWN_API, UNDEFINED_NAME})

STATIC_CHECKS: dict[str, Check] = {
    "unlisted_reference": check_unlisted_reference,
    "no_custom_kernel": check_no_custom_kernel,
    "torch_fallback": check_torch_fallback,
    "try_except_fallback": check_try_except_fallback,
    "other_compiler": check_other_compiler,
    "monkeypatch": check_monkeypatch,
    "forbidden_module": check_forbidden_module,
    "forbidden_builtin": check_forbidden_builtin,
    "side_stream": check_side_stream,
    "global_state": check_global_state,
    "host_compute": check_host_compute,
    "output_caching": check_output_caching,
    "jit_global": check_jit_global,
}


def run_static_checks(
    solution_source: str, backend: str, reference_source: str | None = None
) -> list[CheckFailure]:
    """Every static check on one solution; ``[]`` means it may run.

    ``reference_source`` (the task's PyTorch code) tells ``torch_fallback`` which copying glue
    ops are the task's computation. Unparseable source is not judged here: the sandbox reports
    it as a compile error with Python's own message.
    """
    get_backend(backend)  # an unknown backend is the caller's error, not the solution's
    try:
        analysis = SolutionAnalysis(solution_source, backend)
    except (SyntaxError, ValueError):
        return []
    ref_ops = reference_ops(reference_source)
    failures: list[CheckFailure] = []
    for check in STATIC_CHECKS.values():
        failures.extend(check(analysis, ref_ops))
    return failures
