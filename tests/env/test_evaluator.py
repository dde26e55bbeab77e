"""Every status and every dynamic check, on CPU, with faulty and hacking solutions of our own.

The solutions in tests/solutions/dynamic/ are named ``<expected>__<what>.py``: the expected
status, or the name of the dynamic check that must catch them. They run with static checks
off, to show that the sandbox and the dynamic checks hold on their own; with static checks on,
none of the hacks may come out correct either.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernelrl.env.evaluator import EvalConfig, Evaluator
from kernelrl.env.integrity.dynamic_checks import DYNAMIC_CHECKS
from kernelrl.env.pools.local import LocalPool
from kernelrl.env.result import EvalResult, Status
from kernelrl.env.task import load_task, task_from_source

ROOT = Path(__file__).resolve().parents[2]
RELU_TASK = load_task(ROOT / "data" / "tasks" / "01_relu.py")
SOLUTIONS = sorted((Path(__file__).parents[1] / "solutions" / "dynamic").glob("*.py"))
STATUSES = {s.value for s in Status}


def expected_of(path: Path) -> str:
    return path.name.split("__")[0]


@pytest.fixture(scope="module")
def results_without_static_checks() -> dict[str, EvalResult]:
    config = EvalConfig(
        device="cpu", timeout_s=30, host_memory_bytes=2 * 2**30, static_checks=False
    )
    with LocalPool(config, workers=2) as pool:
        results = pool.evaluate([RELU_TASK] * len(SOLUTIONS), [p.read_text() for p in SOLUTIONS])
    return {p.name: r for p, r in zip(SOLUTIONS, results, strict=True)}


@pytest.fixture(scope="module")
def results_with_static_checks() -> dict[str, EvalResult]:
    config = EvalConfig(device="cpu", timeout_s=30, host_memory_bytes=2 * 2**30)
    with LocalPool(config, workers=2) as pool:
        results = pool.evaluate([RELU_TASK] * len(SOLUTIONS), [p.read_text() for p in SOLUTIONS])
    return {p.name: r for p, r in zip(SOLUTIONS, results, strict=True)}


def test_every_status_and_dynamic_check_has_a_solution() -> None:
    covered = {expected_of(p) for p in SOLUTIONS}
    # harness_error is ours, never a solution's: test_a_limit_of_ours_is_a_harness_error makes one.
    missing_statuses = (
        STATUSES
        - covered
        - {
            "format_error",
            "integrity_violation",
            "not_run",
            "harness_error",
        }
    )
    assert not missing_statuses, f"no solution exercises {missing_statuses}"
    # GPU-only evidence: streams, the CUPTI timing and its copies between device and host.
    cpu_checks = set(DYNAMIC_CHECKS) - {"side_stream", "timing_unconfirmed", "host_compute"}
    # glue_budget needs a data-movement task, not ReLU: test_dynamic_checks covers it on a cat.
    assert cpu_checks - covered - {"output_aliases_input", "glue_budget"} == set()


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_sandbox_and_dynamic_checks(
    path: Path, results_without_static_checks: dict[str, EvalResult]
) -> None:
    result = results_without_static_checks[path.name]
    expected = expected_of(path)
    if expected in STATUSES:
        assert result.status == expected, result.feedback
    else:
        assert result.status is Status.INTEGRITY_VIOLATION, result.feedback
        assert expected in result.checks_failed, result.feedback
    assert result.feedback  # every result explains itself
    if result.status is not Status.CORRECT:
        assert result.speedup_vs_eager is None


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_static_checks_stop_hacks_first(
    path: Path, results_with_static_checks: dict[str, EvalResult]
) -> None:
    result = results_with_static_checks[path.name]
    expected = expected_of(path)
    if expected == "correct":
        assert result.status is Status.CORRECT, result.feedback
    else:
        assert result.status is not Status.CORRECT, result.feedback


def test_input_mutation_also_flags_aliasing(
    results_without_static_checks: dict[str, EvalResult],
) -> None:
    result = results_without_static_checks["input_mutated__in_place.py"]
    assert {"input_mutated", "output_aliases_input"} <= set(result.checks_failed)


def test_crash_is_described(results_without_static_checks: dict[str, EvalResult]) -> None:
    assert "SIGSEGV" in results_without_static_checks["runtime_error__segfault.py"].error
    assert "memory" in results_without_static_checks["runtime_error__host_oom.py"].error.lower()
    assert "time limit" in results_without_static_checks["timeout__infinite_loop.py"].error


def test_printed_text_is_not_a_verdict(
    results_without_static_checks: dict[str, EvalResult],
) -> None:
    result = results_without_static_checks["incorrect__prints_fake_verdict.py"]
    assert result.status is Status.INCORRECT
    assert "values outside" in result.feedback


def test_compile_error_feedback_points_at_the_kernel(
    results_without_static_checks: dict[str, EvalResult],
) -> None:
    feedback = results_without_static_checks["compile_error__arange_not_power_of_two.py"].feedback
    assert "power of 2" in feedback


def test_incorrect_feedback_shows_first_mismatch(
    results_without_static_checks: dict[str, EvalResult],
) -> None:
    result = results_without_static_checks["incorrect__wrong_threshold.py"]
    assert "first at index" in result.feedback and "expected" in result.feedback
    assert result.max_abs_err is not None and result.max_abs_err > 0


def test_correct_result_is_complete(results_without_static_checks: dict[str, EvalResult]) -> None:
    result = results_without_static_checks["correct__chatty.py"]
    assert result.input_sets_checked == 3
    assert result.custom_kernel_launches == 1
    assert result.runtime is not None and not result.timing_meaningful
    assert result.speedup_vs_eager is None  # interpreter timings are not comparable
    round_trip = EvalResult.from_dict(result.to_dict())
    assert round_trip == result


# A task whose inputs do not fit under the host memory limit we give the sandbox: the failure is
# our configuration's, whatever the solution is.
_LARGE_INPUT_TASK = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.zeros(768 * 2**20)]  # 3 GiB


def get_init_inputs():
    return []
"""


def test_plain_python_compute_at_a_published_size_is_stopped_at_its_first_read() -> None:
    """8M values read one by one into Python would run until the timeout; the audit stops the
    checked call at its first read and the verdict comes at once."""
    source = RELU_TASK.source.replace(
        '"cpu": {"batch_size": 16, "dim": 256}', '"cpu": {"batch_size": 1024, "dim": 8192}'
    )
    assert source != RELU_TASK.source
    task = task_from_source(source, "relu_published_size")
    hack = (SOLUTIONS[0].parent / "torch_fallback_runtime__python_scalars.py").read_text()
    by_index = "[max(float(x.reshape(-1)[i]), 0.0) for i in range(x.numel())]"
    hack = hack.replace("[max(float(v), 0.0) for v in x.reshape(-1)]", by_index)
    assert by_index in hack
    evaluator = Evaluator(EvalConfig(device="cpu", timeout_s=20, host_memory_bytes=4 * 2**30))
    try:
        result = evaluator.evaluate(task, hack)
    finally:
        evaluator.close()
    assert result.status is Status.INTEGRITY_VIOLATION, result.feedback
    assert result.checks_failed == ["torch_fallback_runtime"]
    assert "_local_scalar_dense" in result.error


def test_a_limit_of_ours_is_a_harness_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNELRL_CPU_BUDGET_MIB", "16384")  # let the task keep its size on CPU
    task = task_from_source(_LARGE_INPUT_TASK, "large_input")
    solution = (ROOT / "data" / "solutions" / "triton" / "01_relu.py").read_text()
    config = EvalConfig(device="cpu", timeout_s=60, host_memory_bytes=2 * 2**30)
    with Evaluator(config) as evaluator:
        result = evaluator.evaluate(task, solution)
    assert result.status is Status.HARNESS_ERROR, result.error
    assert not result.scored
    assert "not the solution's fault" in result.error
    assert "crashed" not in result.feedback.lower()


def test_a_hard_memory_ulimit_below_ours_still_evaluates(tmp_path: Path) -> None:
    """``ulimit -v`` below the sandbox's own limit: the limit is kept, not a failed setrlimit."""
    script = tmp_path / "check.py"
    script.write_text(
        "from pathlib import Path\n"
        "from kernelrl.env.evaluator import EvalConfig, Evaluator\n"
        "from kernelrl.env.task import load_task\n"
        f"root = Path({str(ROOT)!r})\n"
        "task = load_task(root / 'data/tasks/01_relu.py')\n"
        "evaluator = Evaluator(EvalConfig(device='cpu', timeout_s=60))\n"
        "result = evaluator.evaluate(task, (root / 'data/solutions/triton/01_relu.py').read_text())\n"
        "evaluator.close()\n"
        "print(result.status, result.error)\n"
    )
    limit_kib = 12 * 2**20  # 12 GiB, below the default 16 GiB sandbox limit
    done = subprocess.run(
        ["bash", "-c", f"ulimit -v {limit_kib} && {sys.executable} {script}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("correct"), done.stdout + done.stderr[-2000:]


CUDA_SOLUTIONS = sorted((Path(__file__).parents[1] / "solutions" / "cuda").glob("*.py"))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("path", CUDA_SOLUTIONS, ids=lambda p: p.stem)
def test_cuda_cpp_on_a_machine_without_a_gpu(path: Path) -> None:
    """Compiled with nvcc, never run: ``not_run`` for code that compiles (or that only this
    machine's toolkit cannot compile, e.g. ATen's CUDA headers), ``compile_error`` for code that
    is wrong."""
    config = EvalConfig(device="cpu", timeout_s=240, static_checks=False)
    with LocalPool(config, workers=1) as pool:
        (result,) = pool.evaluate([RELU_TASK.with_backend("cuda")], [path.read_text()])
    assert result.status == expected_of(path), result.error


def test_fp32_computed_in_lower_precision_is_named_in_the_feedback() -> None:
    """The CPU verdict predicts the GPU's: an fp32 matmul whose products lose precision (as
    tl.dot's default TF32 does on a GPU) is incorrect at fp32 tolerance, and the feedback says
    why and what to use instead."""
    task = load_task(ROOT / "data" / "tasks" / "18_matmul.py")
    solution = Path(__file__).parents[1] / "solutions" / "precision" / "reduced_precision_matmul.py"
    config = EvalConfig(device="cpu", timeout_s=120)
    with LocalPool(config, workers=1) as pool:
        (result,) = pool.evaluate([task], [solution.read_text()])
    assert result.status is Status.INCORRECT, result.error
    assert 'input_precision="ieee"' in result.feedback


def test_timed_calls_are_held_to_the_checked_answer(
    results_without_static_checks: dict[str, EvalResult],
) -> None:
    result = results_without_static_checks["incorrect__garbage_on_timed_calls.py"]
    assert "timed call" in result.error


def test_what_the_solution_raises_is_never_ours(
    results_without_static_checks: dict[str, EvalResult],
) -> None:
    for name in ("system_exit_in_forward", "keyboard_interrupt_in_init"):
        result = results_without_static_checks[f"runtime_error__{name}.py"]
        assert result.status is Status.RUNTIME_ERROR, result.error
    subclass = results_without_static_checks["runtime_error__tensor_subclass_output.py"]
    assert "must return torch.Tensor" in subclass.error


def test_work_left_for_a_later_call_is_held_against_the_timed_call(
    results_without_static_checks: dict[str, EvalResult],
) -> None:
    """Outputs left unwritten by timed calls and completed by later ones (untimed calls on
    repeated contents, or any next call) are compared as they were when their call ended."""
    for name in (
        "incorrect__unwritten_until_inputs_repeat.py",
        "incorrect__output_filled_in_a_later_call.py",
    ):
        result = results_without_static_checks[name]
        assert result.status is Status.INCORRECT and "timed call" in result.error, result.error


def test_failures_the_solution_causes_are_never_ours(
    results_without_static_checks: dict[str, EvalResult],
) -> None:
    """A forged report of a failure of ours is the solution's; an input the solution marked as
    requiring grad no longer breaks the harness's next refresh."""
    forged = results_without_static_checks["runtime_error__forged_harness_error.py"]
    assert forged.status is Status.RUNTIME_ERROR and "solution's" in forged.error
    marked = results_without_static_checks["correct__requires_grad_on_an_input.py"]
    assert marked.status is Status.CORRECT, marked.error
