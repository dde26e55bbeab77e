"""Every status and every dynamic check, on CPU, with faulty and hacking solutions of our own.

The solutions in tests/solutions/dynamic/ are named ``<expected>__<what>.py``: the expected
status, or the name of the dynamic check that must catch them. They run with static checks
off, to show that the sandbox and the dynamic checks hold on their own; with static checks on,
none of the hacks may come out correct either.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelrl.env.dynamic_checks import DYNAMIC_CHECKS
from kernelrl.env.evaluator import EvalConfig
from kernelrl.env.pool import LocalPool
from kernelrl.env.result import EvalResult, Status
from kernelrl.env.task import load_task

ROOT = Path(__file__).resolve().parent.parent
RELU_TASK = load_task(ROOT / "data" / "tasks" / "01_relu.py")
SOLUTIONS = sorted((Path(__file__).parent / "solutions" / "dynamic").glob("*.py"))
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
    missing_statuses = STATUSES - covered - {"format_error", "integrity_violation", "not_run"}
    assert not missing_statuses, f"no solution exercises {missing_statuses}"
    cpu_checks = set(DYNAMIC_CHECKS) - {"side_stream", "timing_unconfirmed"}  # GPU-only evidence
    assert cpu_checks - covered - {"output_aliases_input"} == set()


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
