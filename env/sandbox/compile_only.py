"""Solutions on a machine without a GPU: CUDA C++ compiled with nvcc, never loaded or run (its
functions say they need a GPU when called); Triton's libdevice functions made to say that too."""

from __future__ import annotations

import types
from typing import Any


class CompiledOnly(RuntimeError):
    """CUDA C++ that could be compiled here but not run: the child answers ``not_run``."""


class CompiledExtension:
    """What ``load_inline`` gives a solution on a machine without a GPU: every function of the
    extension raises ``CompiledOnly`` when called. The forward still runs under the audit up to
    its first call into CUDA code, so what it does before (torch compute) is judged; only a
    forward that reaches that call with nothing else found ends ``not_run``."""

    def __init__(self, reason: str) -> None:
        self._reason = reason

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        reason = self._reason

        def needs_a_gpu(*_: Any, **__: Any) -> None:
            raise CompiledOnly(reason)

        return needs_a_gpu


class GpuOnly(NotImplementedError):
    """A Triton function only a GPU compile provides, called under the CPU interpreter."""


def refuse_libdevice_in_interpreter() -> None:
    """Under Triton's CPU interpreter, libdevice's functions are the empty stubs a GPU compile
    replaces (they return None, and the kernel then fails elsewhere, as if its own code were
    wrong) or externs the interpreter cannot call. Each is made to raise ``GpuOnly``, which the
    sandbox reports as ``not_run``, as it does inline PTX."""
    import triton.language.extra.libdevice as generic

    modules = [generic]
    try:
        import triton.language.extra.cuda.libdevice as cuda

        modules.append(cuda)
    except ImportError:
        pass
    for module in modules:
        for name, value in list(vars(module).items()):
            if isinstance(value, types.FunctionType) and not name.startswith("_"):
                setattr(module, name, _gpu_only(f"{module.__name__}.{name}"))


def _gpu_only(qualified: str) -> Any:
    def refuse(*_: Any, **__: Any) -> None:
        raise GpuOnly(f"{qualified} exists only in a GPU compile")

    return refuse


def stub_load_inline_for_cpu(scratch: str) -> None:
    """Without a GPU, CUDA C++ is compiled (nvcc -c) but cannot be loaded or run."""
    import shutil
    import subprocess
    import sysconfig
    from pathlib import Path

    import torch.utils.cpp_extension as cpp_extension

    def compile_only(name, cpp_sources=None, cuda_sources=None, **_: Any):
        nvcc = shutil.which("nvcc")
        if nvcc is None:
            return CompiledExtension(
                "nvcc is not installed on this machine: CUDA source not compiled"
            )
        sources = cuda_sources if isinstance(cuda_sources, list | tuple) else [cuda_sources or ""]
        src = Path(scratch) / f"{name}.cu"
        src.write_text("#include <torch/extension.h>\n" + "\n".join(sources))
        includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
        cmd = [nvcc, "-c", "-w", "-std=c++17", "-o", str(src.with_suffix(".o")), str(src)]
        cmd += [f"-I{path}" for path in includes]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        missing = _missing_toolkit_header(proc.stderr, cpp_extension.include_paths())
        if proc.returncode != 0 and missing:
            return CompiledExtension(
                f"this machine's CUDA toolkit lacks {missing}, which torch's own headers include; "
                "the source can only be compiled and run on a GPU machine"
            )
        if proc.returncode != 0:
            errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
            raise RuntimeError(
                f"Error building extension '{name}':\n"
                + "\n".join(errors[:20] or [proc.stderr[-3000:]])
            )
        return CompiledExtension("CUDA source compiled with nvcc; executing it needs a GPU")

    cpp_extension.load_inline = compile_only


def _missing_toolkit_header(stderr: str, torch_includes: list[str]) -> str | None:
    """A header that torch's own headers include (ATen's CUDA headers pull in cuSPARSE, cuBLAS,
    ...) and this machine's toolkit does not have: the machine's gap, not the solution's error."""
    for line in stderr.splitlines():
        if "fatal error:" in line and "No such file" in line:
            including = line.split(":", 1)[0]
            if any(including.startswith(root) for root in torch_includes):
                return line.split("fatal error:", 1)[1].split(":", 1)[0].strip()
    return None
