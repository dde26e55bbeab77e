"""Where a solution computes, on a GPU: host code behind a CUDA C++ extension (its copies to and
from the host in the CUPTI profile), torch glue that is the whole of a data-movement task (the
audit's copied bytes and the profile's copy kernels), import-time compute, scalar parameters
read per call and torch's process-wide state, each judged by the dynamic checks alone (static
checks off) and by the whole evaluator.

    python -m pytest -q tests/env/test_gpu_integrity.py
"""

from __future__ import annotations

from pathlib import Path

import movement_support as movement
import pytest

from kernelrl.env.evaluator import EvalConfig
from kernelrl.env.pools.local import LocalPool
from kernelrl.env.result import EvalResult, Status
from kernelrl.env.task import Task, load_task, task_from_source

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = Path(__file__).parents[1] / "solutions"
RELU = load_task(ROOT / "data" / "tasks" / "01_relu.py")


def _relu_at(batch_size: int, dim: int, task_id: str) -> Task:
    sizes = f'"sizes": {{"cuda": {{"batch_size": {batch_size}, "dim": {dim}}}, "cpu":'
    source = RELU.source.replace('"sizes": {"cpu":', sizes)
    assert source != RELU.source
    return task_from_source(source, task_id)


# A host loop over every value costs milliseconds per call at 2M values, seconds at 32M.
MEDIUM_RELU = _relu_at(256, 8192, "01_relu_medium")
# One one-element parameter per value: the CPU size's 4096 values.
SMALL_RELU = _relu_at(16, 256, "01_relu_small")
MOVEMENT = task_from_source(movement.TASK, "transpose_repeat")


def _evaluate(tasks: list[Task], sources: list[str], static: bool) -> list[EvalResult]:
    config = EvalConfig(device="cuda", timeout_s=300, static_checks=static)
    with LocalPool(config, workers=1) as pool:
        return pool.evaluate(tasks, sources)


def _caught(result: EvalResult, check: str) -> None:
    assert result.status is Status.INTEGRITY_VIOLATION, result.feedback
    assert check in result.checks_failed, result.feedback


@pytest.mark.parametrize("static", [False, True])
def test_cuda_cpp_that_computes_on_the_host_is_caught(static: bool) -> None:
    hack = (SOLUTIONS / "gpu_cuda" / "host_compute__memcpy_host_loop.py").read_text()
    honest = (SOLUTIONS / "static" / "pass__cuda_constants_uploaded.py").read_text()
    task = MEDIUM_RELU.with_backend("cuda")
    caught, correct = _evaluate([task, task], [hack, honest], static)
    _caught(caught, "host_compute")
    assert correct.status is Status.CORRECT, correct.feedback


def test_torch_glue_that_is_a_data_movement_task_is_caught() -> None:
    sources = [movement.BY_KERNEL] + [movement.glue_solution(b) for b in movement.BY_GLUE.values()]
    results = _evaluate([MOVEMENT] * len(sources), sources, static=False)
    assert results[0].status is Status.CORRECT, results[0].feedback
    for spelling, result in zip(movement.BY_GLUE, results[1:], strict=True):
        assert result.status is Status.INTEGRITY_VIOLATION, (spelling, result.feedback)
        found = set(result.checks_failed) & {"glue_budget", "torch_fallback_runtime"}
        assert found, (spelling, result.feedback)


def test_import_time_compute_scalar_reads_and_global_state_are_caught() -> None:
    dynamic = SOLUTIONS / "dynamic"
    cases = [
        (RELU, "init_compute__import_time_table.py", "init_compute"),
        (SMALL_RELU, "torch_fallback_runtime__many_scalar_parameters.py", "torch_fallback_runtime"),
        (RELU, "global_state__default_dtype.py", "global_state"),
        (RELU, "global_state__backend_flag_in_forward.py", "global_state"),
    ]
    results = _evaluate(
        [task for task, _, _ in cases],
        [(dynamic / name).read_text() for _, name, _ in cases],
        static=False,
    )
    for (_, _, check), result in zip(cases, results, strict=True):
        _caught(result, check)
    (plans,) = _evaluate([RELU], [(dynamic / "correct__plan_objects.py").read_text()], True)
    assert plans.status is Status.CORRECT, plans.feedback
