"""Whose failure it is: what follows from the solution's actions is the solution's, and a
``harness_error`` (unscored, retried) only what the trusted side can show is ours.

Each laundering path a red team found (memory taken at import so that the harness cannot make
the inputs, a forged report of a failure of ours, GPU memory beyond the evaluation's share)
ends as the solution's failure; the failures that are ours (the task does not load in the
sandbox, no sandbox starts) stay ``harness_error``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kernelrl.env import attribution, compare
from kernelrl.env.evaluator import EvalConfig, Evaluator
from kernelrl.env.reference import ReferenceRunner
from kernelrl.env.result import EvalResult, Status
from kernelrl.env.sandbox import spawn
from kernelrl.env.task import load_task, task_from_source

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = Path(__file__).parents[1] / "solutions"
RELU = load_task(ROOT / "data" / "tasks" / "01_relu.py")
GOOD = (ROOT / "data" / "solutions" / "triton" / "01_relu.py").read_text()


def _evaluate(task, solutions: list[str], **config) -> list[EvalResult]:
    settings = {"device": "cpu", "timeout_s": 60, "host_memory_bytes": 2 * 2**30}
    with Evaluator(EvalConfig(**{**settings, **config})) as evaluator:
        return [evaluator.evaluate(task, solution) for solution in solutions]


def _never(*_: object) -> str | None:
    raise AssertionError("the memory evidence is asked for an out-of-memory claim only")


# ---------------------------------------------------------------------------- the rules
def test_before_the_solution_is_sent_a_failure_in_the_child_is_ours() -> None:
    for stage in ("task", "inputs", "harness"):
        blame = attribution.child_error({"stage": stage, "error": "x"}, False, _never)
        assert blame.ours and blame.status is Status.HARNESS_ERROR


def test_after_it_the_child_s_claim_of_a_failure_of_ours_is_the_solution_s() -> None:
    for stage in ("task", "inputs", "harness"):
        blame = attribution.child_error({"stage": stage, "error": "x"}, True, _never)
        assert not blame.ours and blame.status is Status.RUNTIME_ERROR
        assert "solution's" in blame.error
    compile_error = attribution.child_error({"stage": "compile", "error": "x"}, True, _never)
    assert compile_error.status is Status.COMPILE_ERROR


def test_an_out_of_memory_is_ours_only_where_the_worker_sees_the_device_short() -> None:
    claim = {"stage": "runtime", "error": "CUDA out of memory", "out_of_memory": True}
    short = attribution.child_error(claim, True, lambda: "the device had 0.10 GiB free")
    assert short.ours and "0.10 GiB" in short.error
    room = attribution.child_error(claim, True, lambda: None)
    assert not room.ours and room.status is Status.RUNTIME_ERROR
    unclaimed = attribution.child_error({**claim, "out_of_memory": False}, True, _never)
    assert unclaimed.status is Status.RUNTIME_ERROR


def test_not_run_is_believed_on_a_cpu_only() -> None:
    message = {"type": "not_run", "reason": "inline PTX"}
    assert attribution.not_run(message, "cpu").status is Status.NOT_RUN
    assert attribution.not_run(message, "cuda").status is Status.RUNTIME_ERROR


def test_a_child_lost_before_the_solution_was_sent_is_ours() -> None:
    assert attribution.child_lost("crashed", False, False, False).ours
    assert attribution.child_lost("crashed", True, True, False).ours  # its fork server died
    timeout = attribution.child_lost("exceeded the time limit", False, True, True)
    assert (timeout.ours, timeout.status) == (False, Status.TIMEOUT)


# ---------------------------------------------------------------------------- end to end, CPU
# 128 MiB of input on CPU: what the solution leaves of the address space cannot hold it.
_LARGE_RELU = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


n = 1024


def get_inputs():
    return [torch.randn(n)]


def get_init_inputs():
    return []


KERNELRL = {"sizes": {"cpu": {"n": 33554432}}}
"""

# Loads in the worker, not in the sandbox (whose environment names its device): a difference
# between our two sides, never the solution's doing.
_SANDBOX_ONLY_FAILURE = """
import os
import torch
import torch.nn as nn

if os.environ.get("KERNELRL_DEVICE"):
    raise RuntimeError("this task does not load in the sandbox")


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(16, 256)]


def get_init_inputs():
    return []
"""


def test_memory_taken_at_import_so_the_inputs_cannot_be_made_is_the_solution_s() -> None:
    task = task_from_source(_LARGE_RELU, "relu_128mib")
    grab = (SOLUTIONS / "attribution" / "runtime_error__host_memory_grab_at_import.py").read_text()
    (result,) = _evaluate(task, [grab], static_checks=False)
    assert result.status is Status.RUNTIME_ERROR, result.error
    assert "inputs" in result.error and "solution's" in result.error


def test_a_forged_report_of_a_failure_of_ours_is_the_solution_s() -> None:
    forged = (SOLUTIONS / "dynamic" / "runtime_error__forged_harness_error.py").read_text()
    at_import = (SOLUTIONS / "attribution" / "runtime_error__forged_error_at_import.py").read_text()
    solutions = [
        forged.replace('STAGE = "harness"', 'STAGE = "inputs"'),
        at_import,
        at_import.replace('STAGE = "task"', 'STAGE = "harness"'),
    ]
    assert solutions[0] != forged and solutions[2] != at_import
    for result in _evaluate(RELU, solutions, static_checks=False):
        assert result.status is Status.RUNTIME_ERROR, result.error
        assert "solution's" in result.error


def test_failures_of_ours_stay_harness_errors() -> None:
    task = task_from_source(_SANDBOX_ONLY_FAILURE, "loads_in_the_worker_only")
    assert "KERNELRL_DEVICE" not in os.environ
    (result,) = _evaluate(task, [GOOD])
    assert result.status is Status.HARNESS_ERROR, result.error
    assert "before the solution was loaded" in result.error
    assert "does not load in the sandbox" in result.error

    evaluator = Evaluator(EvalConfig(device="cpu", timeout_s=60))
    evaluator.close()  # no sandbox can be started any more
    result = evaluator.evaluate(RELU, GOOD)
    assert result.status is Status.HARNESS_ERROR, result.error
    assert "no sandbox could be started" in result.error


def test_the_trusted_side_s_own_failure_after_the_solution_ran_is_ours(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The comparison's arithmetic raising (a fault of ours, e.g. a kernel launch the device
    refuses) comes after the solution ran and sent its outputs; it is still a harness_error,
    never the solution's runtime_error; the same failure in the reference's outputs too."""

    def broken(*_: object) -> None:
        raise RuntimeError("Triton Error [CUDA]: invalid argument")

    monkeypatch.setattr(compare, "chunk_partials", broken)
    (result,) = _evaluate(RELU, [GOOD])
    assert result.status is Status.HARNESS_ERROR, result.error
    assert "trusted side failed computing or comparing" in result.error
    assert "invalid argument" in result.error
    monkeypatch.undo()
    monkeypatch.setattr(ReferenceRunner, "output", broken)
    (result,) = _evaluate(RELU, [GOOD])
    assert result.status is Status.HARNESS_ERROR, result.error


def test_cuda_cpp_on_a_cpu_is_judged_up_to_its_first_call_into_cuda(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a machine without a GPU, ``load_inline`` gives an extension whose functions say they
    need a GPU when called: the forward runs under the audit up to that call, so torch compute
    before it is a violation, and only a forward with nothing else found is ``not_run``. (The
    sandbox is given no nvcc here: compiling torch's headers takes minutes on a CPU box; a
    child's environment is the worker's as it started, ``spawn``'s.)"""
    path = [d for d in os.environ["PATH"].split(os.pathsep) if not shutil.which("nvcc", path=d)]
    monkeypatch.setitem(spawn._STARTED_ENV, "PATH", os.pathsep.join(path))
    after_torch = (
        SOLUTIONS / "attribution" / "torch_fallback_runtime__cuda_cpp_after_torch.py"
    ).read_text()
    plain = (SOLUTIONS / "cuda" / "not_run__relu.py").read_text()
    violation, not_run = _evaluate(
        RELU.with_backend("cuda"), [after_torch, plain], static_checks=False
    )
    assert violation.status is Status.INTEGRITY_VIOLATION, violation.error
    assert violation.checks_failed == ["torch_fallback_runtime"]
    assert not_run.status is Status.NOT_RUN, not_run.error
    assert "nvcc is not installed" in not_run.error


def test_the_clocks_a_timing_ran_at_are_read_with_why_they_are_held_down() -> None:
    """NVML's answers as the driver's library gives them (values written through pointers,
    the reasons as bits), read here without a GPU through a stand-in for that library; the
    GPU test below reads the real one."""
    import ctypes

    from kernelrl.env.sandbox.gpu_memory import Nvml, NvmlError

    class Driver:
        def __init__(self, failing: str = "", reasons: str = "EventReasons") -> None:
            self.failing, self.reasons = failing, f"nvmlDeviceGetCurrentClocks{reasons}"

        def __getattr__(self, name: str):
            values = {
                "nvmlDeviceGetClockInfo": lambda kind: {1: 1755, 2: 2619}[kind],
                "nvmlDeviceGetTemperature": lambda kind: 61,
                self.reasons: lambda: 0x4 | 0x20,
            }
            if name not in values:
                raise AttributeError(name)

            def call(handle, *args):
                *kind, pointer = args
                pointer._obj.value = values[name](*kind)
                return 3 if name == self.failing else 0

            return call

    nvml = Nvml.__new__(Nvml)
    nvml.handle, nvml.lib = ctypes.c_void_p(), Driver()
    assert nvml.clocks() == {
        "sm_mhz": 1755,
        "memory_mhz": 2619,
        "temperature_c": 61,
        "held_down": ["sw_power_cap", "sw_thermal"],
    }
    nvml.lib = Driver(reasons="ThrottleReasons")  # an older driver
    assert nvml.clocks()["held_down"] == ["sw_power_cap", "sw_thermal"]
    nvml.lib = Driver(failing="nvmlDeviceGetTemperature")
    with pytest.raises(NvmlError, match="nvmlDeviceGetTemperature failed"):
        nvml.clocks()


# ---------------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_the_watch_reads_this_process_s_gpu_memory() -> None:
    import torch

    from kernelrl.env.sandbox.gpu_memory import GpuShare, watch_for

    device = torch.device("cuda", 0)
    watch = watch_for(device)
    assert watch.attributes, watch.problem
    held = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    mine = watch.held_by([os.getpid()])
    assert mine is not None and mine >= torch.cuda.memory_reserved(device) >= held.numel()
    free = watch.free()
    assert free is not None
    assert GpuShare(watch, mine + free + 2**30).shortfall([os.getpid()]) is not None
    assert GpuShare(watch, mine + 2**30).shortfall([os.getpid()]) is None
    assert GpuShare(watch, 2**20).shortfall([os.getpid()]) is None  # above its share: not ours
    assert GpuShare(watch, 2**20).over_share(lambda: [os.getpid()]) == mine
    clocks = watch.clocks()
    assert clocks["sm_mhz"] > 0 and clocks["memory_mhz"] > 0, clocks
    assert 0 < clocks["temperature_c"] < 120 and isinstance(clocks["held_down"], list), clocks


@pytest.mark.gpu
def test_a_sandbox_above_its_gpu_share_is_killed_and_a_grab_at_import_is_the_solution_s() -> None:
    hoard = SOLUTIONS / "gpu_memory" / "runtime_error__holds_memory_beyond_its_share.py"
    grab = SOLUTIONS / "gpu" / "runtime_error__grabs_gpu_memory_at_import.py"
    held, grabbed, good = _evaluate(
        RELU,
        [hoard.read_text(), grab.read_text(), GOOD],
        device="cuda",
        static_checks=False,
        timeout_s=120,
    )
    assert held.sandbox["gpu_memory_watch"].startswith("nvml"), held.sandbox
    assert held.status is Status.RUNTIME_ERROR, held.error
    assert "admitted for this evaluation" in held.error
    assert grabbed.status is Status.RUNTIME_ERROR, grabbed.error
    assert good.status is Status.CORRECT, good.error  # a solution within its share is left be
    assert good.sandbox["gpu_clocks"]["sm_mhz"] > 0, good.sandbox  # what its timing ran at
    share = good.sandbox["gpu_memory_share"]  # and how much of its plan it used
    assert 0 < share["most_held_gib"] <= share["admitted_gib"], share


@pytest.mark.gpu
def test_memory_a_grab_holds_is_not_handed_to_the_next_evaluation() -> None:
    """Evaluated right after a solution that took the device's memory, a good one is judged
    on its own: it is admitted once the other's child has exited, never into memory a dying
    child still holds (its inputs failed then, a harness_error the other solution caused)."""
    grab = (SOLUTIONS / "gpu" / "runtime_error__grabs_gpu_memory_at_import.py").read_text()
    results = _evaluate(RELU, [grab, GOOD] * 3, device="cuda", static_checks=False, timeout_s=120)
    for grabbed, good in zip(results[::2], results[1::2], strict=True):
        assert grabbed.status is Status.RUNTIME_ERROR, grabbed.error
        assert good.status is Status.CORRECT, good.error


@pytest.mark.gpu
def test_the_profile_leaves_out_the_kernels_of_new_input_contents() -> None:
    """Profiled calls get new contents like timed ones; the kernels that make them (here
    ``randn``'s) are the harness's and must not show in the solution's profile."""
    import types

    import torch

    from kernelrl.env.integrity.audit import LaunchCounter
    from kernelrl.env.sandbox import harness
    from kernelrl.env.sandbox.timed_run import profile_kernels

    device = torch.device("cuda")
    module = types.ModuleType("randn_task")
    module.get_inputs = lambda: [torch.randn(1 << 20)]
    timed = harness.TimedInputs(lambda seed: harness.make_inputs(module, seed, device), 1, 1)

    def call() -> None:
        torch.sin(timed.sets[0][0])

    def launched_outside_any_op() -> None:  # a Triton-style launch: no torch op around it
        timed.sets[0][0].sin_()

    refresh = [lambda: timed.refresh(0)] * 3
    profile = profile_kernels(
        [call, call, launched_outside_any_op], device, LaunchCounter(), prepares=refresh
    )
    names = [kernel["name"] for kernel in profile["kernels"]]
    assert len(names) == 3 and all("sin" in name for name in names), names
    assert profile["aten_ops"] == {"aten::sin": 2, "aten::sin_": 1}
