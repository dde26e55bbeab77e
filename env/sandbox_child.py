"""The sandboxed child: the only process that ever executes a generated solution.

Started by the worker ahead of time (``python -m kernelrl.env.sandbox_child FD PARENT_PID``)
so that interpreter start, ``import torch`` and CUDA context creation are paid while another
evaluation runs. It then waits for exactly one job, runs it, and exits: no state survives from one
solution to the next. Everything it reports goes through the socket ``FD``; the worker decides
every verdict itself.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys
import time
import traceback
from collections import Counter
from typing import Any

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1


def isolate_network() -> str:
    """Move this (still single-threaded) process into an empty network namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    for flags, label in ((CLONE_NEWNET, "netns"), (CLONE_NEWUSER | CLONE_NEWNET, "userns+netns")):
        if libc.unshare(flags) == 0:
            return label
    return f"unavailable (errno {ctypes.get_errno()})"


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL from the kernel when the thread that spawned this child ends (the sandbox's
    spawner thread lives as long as the worker process): a worker that dies, however it dies,
    takes its children along, running or paused, and never before it has itself stopped
    answering, so no verdict comes from a child killed by its worker's death."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # the worker died before the line above
        os._exit(1)


# Network isolation must happen before torch starts its threads: unshare moves only the
# calling thread, so the process has to be single-threaded for it to cover everything.
# The death signal is set after it: a change of credentials would clear it.
NETWORK = "not isolated"
if __name__ == "__main__":
    NETWORK = isolate_network()
    die_with_parent(int(sys.argv[2]))
_IMPORT_STARTED = time.perf_counter()

import socket  # noqa: E402

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from kernelrl.env import harness  # noqa: E402
from kernelrl.env.protocol import recv_message, send_message  # noqa: E402
from kernelrl.env.timing import TimingConfig, placements, time_fn  # noqa: E402

SOLUTION_MODULE = "kernelrl_solution"
TASK_MODULE = "kernelrl_task"

# aten ops that do a task's real computation; a solution's forward must leave them to its kernels.
ATEN_COMPUTE_OPS = frozenset(
    "aten::" + op
    for op in [
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "matmul",
        "linear",
        "einsum",
        "dot",
        "mv",
        "addmv",
        "convolution",
        "_convolution",
        "conv1d",
        "conv2d",
        "conv3d",
        "cudnn_convolution",
        "mkldnn_convolution",
        "conv_transpose2d",
        "softmax",
        "_softmax",
        "log_softmax",
        "_log_softmax",
        "layer_norm",
        "native_layer_norm",
        "batch_norm",
        "native_batch_norm",
        "group_norm",
        "native_group_norm",
        "rms_norm",
        "_fused_rms_norm",
        "sum",
        "mean",
        "amax",
        "amin",
        "max",
        "min",
        "argmax",
        "argmin",
        "cumsum",
        "cumprod",
        "prod",
        "var",
        "std",
        "norm",
        "linalg_vector_norm",
        "logsumexp",
        "relu",
        "relu_",
        "gelu",
        "silu",
        "sigmoid",
        "tanh",
        "exp",
        "log",
        "sqrt",
        "rsqrt",
        "pow",
        "add",
        "add_",
        "sub",
        "sub_",
        "mul",
        "mul_",
        "div",
        "div_",
        "where",
        "clamp",
        "clamp_min",
        "clamp_max",
        "maximum",
        "minimum",
        "abs",
        "neg",
        "reciprocal",
        "sort",
        "topk",
        "mse_loss",
        "l1_loss",
        "smooth_l1_loss",
        "huber_loss",
        "nll_loss",
        "nll_loss_forward",
        "nll_loss2d_forward",
        "cross_entropy_loss",
        "kl_div",
        "binary_cross_entropy",
        "binary_cross_entropy_with_logits",
        "cosine_similarity",
        "_scaled_dot_product_attention",
        "scaled_dot_product_attention",
        "max_pool2d",
        "avg_pool2d",
        "adaptive_avg_pool2d",
        "hardtanh",
        "leaky_relu",
        "elu",
        "softplus",
        "mish",
        "hardswish",
        "erf",
    ]
)


class AtenOpRecorder(TorchDispatchMode):
    """Counts the compute aten ops forward dispatches.

    Used on CPU only. On a GPU the CUPTI profile of the timing phase lists the aten ops anyway
    (``profile_kernels``), while a dispatch mode around a Triton launch makes torch import its
    Triton-wrapping machinery (dynamo, sympy, fsdp): about 5 s per fresh child, measured on an
    H100 worker, which was most of an evaluation.
    """

    def __init__(self, counts: Counter[str]) -> None:
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        name = func._schema.name
        if name in ATEN_COMPUTE_OPS:
            self.counts[name] += 1
        return func(*args, **(kwargs or {}))


class LaunchCounter:
    """Counts launches of the solution's own Triton kernels, on CPU and GPU alike.

    Installed on Triton's kernel classes before the solution is imported; only kernels whose
    Python function lives in the solution module are counted.
    """

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def install(self) -> None:
        import triton.runtime.jit as jit

        classes = [jit.JITFunction]
        try:
            from triton.runtime.interpreter import InterpretedFunction

            classes.append(InterpretedFunction)
        except ImportError:
            pass
        for cls in classes:
            original = cls.run

            def counted_run(self, *args, _original=original, **kwargs):
                if (
                    not kwargs.get("warmup", False)
                    and getattr(self.fn, "__module__", "") == SOLUTION_MODULE
                ):
                    self.counts_owner.counts[self.fn.__name__] += 1
                return _original(self, *args, **kwargs)

            cls.run = counted_run
            cls.counts_owner = self

    def total(self) -> int:
        return sum(self.counts.values())


def apply_limits(limits: dict[str, Any], device: torch.device) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    file_bytes = int(limits["file_bytes"])
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    cpu_seconds = int(limits["cpu_seconds"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))
    if device.type == "cpu" and limits.get("address_space_bytes"):
        size = int(limits["address_space_bytes"])
        resource.setrlimit(resource.RLIMIT_AS, (size, size))
    if device.type == "cuda" and limits.get("gpu_memory_fraction"):
        torch.cuda.set_per_process_memory_fraction(float(limits["gpu_memory_fraction"]))


def short_traceback(exc: BaseException, limit_chars: int = 2000) -> str:
    """The traceback frames of the solution only, with its own line numbers."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if f.filename.startswith("<kernelrl_solution")]
    lines = [f"  line {f.lineno}, in {f.name}: {f.line or ''}".rstrip() for f in own[-4:]]
    message = f"{type(exc).__name__}: {exc}"
    text = "\n".join([*lines, message]) if lines else message
    return text[-limit_chars:]


def is_compile_error(exc: BaseException) -> bool:
    """Errors Triton's compiler raises; under the interpreter, errors raised inside kernel code
    (shape, type and API misuse: what the compiler would have rejected; true memory faults
    crash the process instead)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(
        names
        & {
            "CompilationError",
            "CompileTimeAssertionFailure",
            "MLIRCompilationError",
            "InterpreterError",
        }
    )


def stub_load_inline_for_cpu(scratch: str) -> None:
    """Without a GPU, CUDA C++ is compiled (nvcc -c) but cannot be loaded or run."""
    import shutil
    import subprocess
    import sysconfig
    from pathlib import Path

    import torch.utils.cpp_extension as cpp_extension

    class CompiledOnly(RuntimeError):
        pass

    def compile_only(name, cpp_sources=None, cuda_sources=None, **_: Any):
        nvcc = shutil.which("nvcc")
        if nvcc is None:
            raise CompiledOnly("nvcc is not installed on this machine: CUDA source not compiled")
        sources = cuda_sources if isinstance(cuda_sources, list | tuple) else [cuda_sources or ""]
        src = Path(scratch) / f"{name}.cu"
        src.write_text("#include <torch/extension.h>\n" + "\n".join(sources))
        includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
        cmd = [nvcc, "-c", "-w", "-std=c++17", "-o", str(src.with_suffix(".o")), str(src)]
        cmd += [f"-I{path}" for path in includes]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
            raise RuntimeError(
                f"Error building extension '{name}':\n"
                + "\n".join(errors[:20] or [proc.stderr[-3000:]])
            )
        raise CompiledOnly("CUDA source compiled with nvcc; executing it needs a GPU")

    cpp_extension.load_inline = compile_only


def run_job(sock: socket.socket, job: dict[str, Any], counter: LaunchCounter) -> None:
    device = torch.device(job["device"])
    phase: dict[str, float] = {}

    def fail(stage: str, exc: BaseException) -> None:
        send_message(
            sock, {"type": "error", "stage": stage, "error": short_traceback(exc), "phase": phase}
        )

    task = harness.load_module(job["task_source"], TASK_MODULE, job["size_overrides"])
    if job["backend"] == "cuda" and device.type == "cpu":
        stub_load_inline_for_cpu(os.getcwd())

    start = time.perf_counter()
    try:
        solution = harness.load_module(job["solution_source"], SOLUTION_MODULE)
    except Exception as exc:
        phase["load"] = time.perf_counter() - start
        if type(exc).__name__ == "CompiledOnly":
            send_message(sock, {"type": "not_run", "reason": str(exc), "phase": phase})
            return
        fail("compile", exc)
        return
    phase["load"] = time.perf_counter() - start

    start = time.perf_counter()
    try:
        model = harness.build_model(solution.ModelNew, task, job["model_seed"], device)
    except Exception as exc:
        fail("runtime", exc)
        return

    paths: list[str] = []
    launches: list[int] = []
    flags: list[str] = []
    kept_outputs: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []
    aten_ops: Counter[str] = Counter()
    for index, seed in enumerate(job["input_seeds"]):
        inputs = harness.make_inputs(task, seed, device)
        before = [t.clone() for t in harness.tensors_in(inputs)]
        counter.counts.clear()
        try:
            if index == 1 and device.type == "cpu":  # which aten ops does forward run?
                with torch.no_grad(), AtenOpRecorder(aten_ops):
                    output = model(*inputs)
            else:
                with torch.no_grad():
                    output = model(*inputs)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if index == 0:  # the first call compiles the kernels (JIT) and runs them once
                phase["first_call"] = time.perf_counter() - start
        except Exception as exc:
            phase["correctness"] = time.perf_counter() - start
            fail("compile" if is_compile_error(exc) else "runtime", exc)
            return
        launches.append(counter.total())
        outputs = harness.as_output_list(output)
        tensors = harness.tensors_in(outputs)
        if any(
            not torch.equal(a, b) for a, b in zip(harness.tensors_in(inputs), before, strict=True)
        ):
            flags.append("input_mutated")
        if any(harness.storages_overlap(o, i) for o in tensors for i in harness.tensors_in(inputs)):
            flags.append("output_aliases_input")
        if any(
            harness.storages_overlap(o, k)
            for o in tensors
            for prev, _ in kept_outputs
            for k in prev
        ):
            flags.append("output_reused")
        kept_outputs.append((tensors, [t.clone() for t in tensors]))
        path = os.path.join(os.getcwd(), f"outputs_{index}.pt")
        torch.save([o.detach().cpu() if isinstance(o, torch.Tensor) else o for o in outputs], path)
        paths.append(path)
    # An output overwritten by a later call was handed out twice: results reused across calls.
    if any(
        not torch.equal(t, c)
        for prev, clones in kept_outputs
        for t, c in zip(prev, clones, strict=True)
    ):
        flags.append("output_reused")
    phase["correctness"] = time.perf_counter() - start
    send_message(
        sock,
        {
            "type": "outputs",
            "paths": paths,
            "launches": launches,
            "flags": sorted(set(flags)),
            "aten_ops": dict(aten_ops),
            "phase": phase,
        },
    )
    if recv_message(sock)["type"] != "time":
        return

    config = TimingConfig(**job["timing"])
    count = placements(device, config)
    input_sets = harness.timing_input_sets(task, job["input_seeds"][0], device, count)
    calls = [harness.forward_call(model, inputs) for inputs in input_sets]

    start = time.perf_counter()
    try:
        stats = time_fn(calls, device, config)
        phase["timing"] = time.perf_counter() - start
        start = time.perf_counter()
        profile = (
            profile_kernels(calls[0], device, job["profile_calls"], counter)
            if device.type == "cuda"
            else {}
        )
        phase["profile"] = time.perf_counter() - start
    except Exception as exc:
        fail("runtime", exc)
        return
    send_message(
        sock, {"type": "timing", "runtime": stats.__dict__, "profile": profile, "phase": phase}
    )


def profile_kernels(
    call, device: torch.device, calls: int, counter: LaunchCounter
) -> dict[str, Any]:
    """GPU kernels of ``calls`` forward calls under CUPTI: names, time, stream.

    A marker kernel launched on the caller's current stream first tells which stream id the
    profiler gives that stream, so work on any other stream can be recognised.
    """
    from torch.profiler import ProfilerActivity, profile

    marker = torch.zeros(1, device=device)
    torch.cuda.synchronize()
    counter.counts.clear()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        marker.fill_(1.0)  # not a compute op: it must not count as the solution's aten work
        torch.cuda.synchronize()
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    kernels = []
    marker_stream = None
    aten_ops: Counter[str] = Counter()
    for event in prof.profiler.kineto_results.events():
        if (
            event.device_type() == torch.autograd.DeviceType.CPU
            and event.name() in ATEN_COMPUTE_OPS
        ):
            aten_ops[event.name()] += 1
        if event.device_type() != torch.autograd.DeviceType.CUDA or event.is_user_annotation():
            continue
        name = event.name()
        if name.startswith(("Memcpy", "Memset", "cudaMemcpy")):
            continue
        stream = event.device_resource_id()
        if marker_stream is None:
            marker_stream = stream  # the first kernel is the marker
            continue
        kernels.append({"name": name, "us": event.duration_ns() / 1e3, "stream": stream})
    return {
        "kernels": kernels,
        "current_stream": marker_stream,
        "calls": calls,
        "aten_ops": dict(aten_ops),
        "triton_launches": dict(counter.counts),
    }


def warm_profiler(device: torch.device) -> None:
    """Start CUPTI once on a trusted marker kernel, before any job arrives.

    The first profiler session of a process pays for loading and initialising CUPTI: 4 to 6 s
    on an H100 host, measured inside the profile phase of every evaluation, where it was the
    largest part. Paid here, it overlaps another evaluation like the CUDA context does.
    """
    from torch.profiler import ProfilerActivity, profile

    marker = torch.zeros(1, device=device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        marker.fill_(1.0)
        torch.cuda.synchronize()
    list(prof.profiler.kineto_results.events())


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    import triton  # noqa: F401 - warm import

    imported = time.perf_counter()
    device = torch.device(os.environ.get("KERNELRL_DEVICE", "cpu"))
    profiler_seconds = 0.0
    if device.type == "cuda":
        torch.cuda.init()
        torch.zeros(1, device=device)  # creates the CUDA context now, not during the job
        cuda_ready = time.perf_counter()
        warm_profiler(device)
        profiler_seconds = time.perf_counter() - cuda_ready
    counter = LaunchCounter()
    counter.install()
    ready = {
        "type": "ready",
        "pid": os.getpid(),
        "import_seconds": imported - _IMPORT_STARTED,
        "cuda_init_seconds": time.perf_counter() - imported - profiler_seconds,
        "profiler_init_seconds": profiler_seconds,
        "network": NETWORK,
    }
    send_message(sock, ready)
    try:
        job = recv_message(sock)
    except EOFError:
        os._exit(0)
    apply_limits(job["limits"], device)
    try:
        run_job(sock, job, counter)
    except Exception as exc:  # the harness itself failed: report it, never a verdict
        send_message(sock, {"type": "error", "stage": "harness", "error": short_traceback(exc)})
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
