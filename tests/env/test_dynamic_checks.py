"""The dynamic checks' verdicts on evidence built by hand: what the trusted side concludes from
a child's reports, including claims that contradict each other or the wall clock."""

from __future__ import annotations

from pathlib import Path

import movement_support as movement
import pytest

from kernelrl.env.evaluator import EvalConfig, Evaluator
from kernelrl.env.integrity import dynamic_checks
from kernelrl.env.integrity.dynamic_checks import CallEvidence
from kernelrl.env.integrity.static_checks import run_static_checks
from kernelrl.env.result import EvalResult, Status
from kernelrl.env.task import task_from_source


def _profile(kernels: list[tuple[str, float, int]], calls: int = 5) -> dict:
    return {
        "kernels": [{"name": n, "us": us, "stream": s} for n, us, s in kernels],
        "current_stream": 7,
        "calls": calls,
        "aten_ops": {},
        "triton_launches": {},
    }


def _names(violations: list[tuple[str, str]]) -> set[str]:
    return {name for name, _ in violations}


def _gpu_verdict(kernels: list[tuple[str, float, int]], median_ms: float) -> set[str]:
    profile = _profile(kernels)
    summary = dynamic_checks.summarize_profile(profile, ["relu_kernel"])
    return _names(dynamic_checks.check_gpu_profile(profile, summary, median_ms))


def test_an_honest_profile_passes() -> None:
    kernels = [("relu_kernel", 100.0, 7)] * 5
    assert _gpu_verdict(kernels, median_ms=0.11) == set()


def test_events_that_saw_less_than_the_profiler_are_unconfirmed() -> None:
    kernels = [("relu_kernel", 100.0, 7)] * 5  # 0.1 ms of GPU work per call
    assert _gpu_verdict(kernels, median_ms=0.02) == {"timing_unconfirmed"}


def test_on_a_shared_gpu_only_the_agreement_of_the_two_timings_is_not_asked() -> None:
    """Another process's kernels stretch either timing; the rest of the evidence is this
    process's own (CUPTI records only its kernels) and is judged as ever."""
    kernels = [("relu_kernel", 100.0, 7), ("relu_kernel", 100.0, 9)] * 5
    profile = _profile(kernels)
    summary = dynamic_checks.summarize_profile(profile, ["relu_kernel"])
    alone = dynamic_checks.check_gpu_profile(profile, summary, 0.02)
    shared = dynamic_checks.check_gpu_profile(profile, summary, 0.02, timed_alone=False)
    assert _names(alone) == {"timing_unconfirmed", "side_stream"}
    assert _names(shared) == {"side_stream"}


def test_a_torch_kernel_that_is_not_glue_is_a_fallback() -> None:
    gemm = "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32"
    kernels = [("relu_kernel", 10.0, 7), (gemm, 90.0, 7)] * 5
    assert _gpu_verdict(kernels, median_ms=0.11) == {"torch_fallback_runtime"}


def test_copies_beside_the_kernel_pass_until_they_dominate() -> None:
    copy = "void at::native::elementwise_kernel<128, 2, direct_copy_kernel_cuda>"
    light = [("relu_kernel", 80.0, 7), (copy, 20.0, 7)] * 5
    heavy = [("relu_kernel", 20.0, 7), (copy, 80.0, 7)] * 5
    assert _gpu_verdict(light, median_ms=0.11) == set()
    assert _gpu_verdict(heavy, median_ms=0.11) == {"glue_budget"}


def test_copies_that_dominate_a_compute_task_only_cost_runtime() -> None:
    copy = "void at::native::elementwise_kernel<128, 2, direct_copy_kernel_cuda>"
    heavy = [("relu_kernel", 20.0, 7), (copy, 80.0, 7)] * 5
    profile = _profile(heavy)
    summary = dynamic_checks.summarize_profile(profile, ["relu_kernel"])
    violations = dynamic_checks.check_gpu_profile(profile, summary, 0.11, glue_is_task=False)
    assert violations == []


def test_work_on_another_stream_is_flagged() -> None:
    kernels = [("relu_kernel", 100.0, 9)] * 5
    assert "side_stream" in _gpu_verdict(kernels, median_ms=0.11)


def _timing_report(**changes: object) -> dict:
    report = {
        "runtime": {"median_ms": 0.1, "min_ms": 0.09, "reps": 200},
        "timed_calls": 260,
        "timed_launches": 260,
        "compute_ops": {},
        "tampered": [],
    }
    report.update(changes)
    return report


def test_consistent_timing_claims_pass() -> None:
    assert dynamic_checks.check_timing_report(_timing_report(), "triton", wall_s=0.5) == []


def test_more_samples_than_calls_is_unconfirmed() -> None:
    report = _timing_report(timed_calls=50)
    assert _names(dynamic_checks.check_timing_report(report, "triton", 0.5)) == {
        "timing_unconfirmed"
    }


def test_more_timed_work_than_wall_clock_is_unconfirmed() -> None:
    report = _timing_report(runtime={"median_ms": 10.0, "min_ms": 9.0, "reps": 200})
    assert "timing_unconfirmed" in _names(dynamic_checks.check_timing_report(report, "triton", 0.5))


def test_timed_calls_without_own_launches_are_caught() -> None:
    report = _timing_report(timed_launches=3)
    assert _names(dynamic_checks.check_timing_report(report, "triton", 0.5)) == {
        "no_kernel_executed"
    }


def test_spot_audits_and_tampering_in_the_timing_phase_count() -> None:
    report = _timing_report(compute_ops={"aten::relu": 2}, tampered=["time.perf_counter"])
    assert _names(dynamic_checks.check_timing_report(report, "triton", 0.5)) == {
        "torch_fallback_runtime",
        "harness_tampered",
    }


def test_glue_bytes_beyond_the_budget_are_flagged_where_glue_can_be_the_task() -> None:
    evidence = CallEvidence()
    base = {"launches": 1, "flags": [], "compute_ops": {}, "tampered": [], "io_bytes": 1000}
    evidence.add({**base, "copied_bytes": 200})
    assert dynamic_checks.check_calls(evidence, "triton") == []
    evidence.add({**base, "copied_bytes": 500})  # a cat done by torch copies the whole output
    assert _names(dynamic_checks.check_calls(evidence, "triton")) == {"glue_budget"}
    assert dynamic_checks.check_calls(evidence, "triton", glue_is_task=False) == []


def test_only_data_movement_references_make_glue_the_task() -> None:
    assert dynamic_checks.glue_can_be_the_task(CAT_TASK)
    assert dynamic_checks.glue_can_be_the_task(BROADCAST_TASK)
    for task in ("01_relu", "05_channel_affine", "12_group_norm", "30_scaled_qk_softmax"):
        source = (ROOT / "data" / "tasks" / f"{task}.py").read_text()
        assert not dynamic_checks.glue_can_be_the_task(source), task


# A pure data-movement task: the reference only concatenates.
CAT_TASK = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return torch.cat([a, b], dim=1)


def get_inputs():
    return [torch.randn(16, 128), torch.randn(16, 64)]


def get_init_inputs():
    return []
"""
BROADCAST_TASK = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        out = torch.empty(64, x.shape[1])
        out.copy_(x)
        return out


def get_inputs():
    return [torch.randn(1, 256)]


def get_init_inputs():
    return []
"""
_CAT_KERNEL = """
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def place_kernel(src_ptr, out_ptr, cols, out_cols, offset, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    vals = tl.load(src_ptr + row * cols + offs, mask=mask)
    tl.store(out_ptr + row * out_cols + offset + offs, vals, mask=mask)


def place(src, out, offset):
    rows, cols = src.shape
    place_kernel[(rows,)](
        src, out, cols, out.shape[1], offset, BLOCK=triton.next_power_of_2(cols)
    )
"""
# Legitimate: its own kernel places both inputs into a fresh output.
CAT_BY_KERNEL = (
    _CAT_KERNEL
    + """

class ModelNew(nn.Module):
    def forward(self, a, b):
        a, b = a.contiguous(), b.contiguous()
        out = torch.empty(a.shape[0], a.shape[1] + b.shape[1], dtype=a.dtype, device=a.device)
        place(a, out, 0)
        place(b, out, a.shape[1])
        return out
"""
)
# Hack: torch.cat does the task; the kernel only copies the finished result.
CAT_BY_GLUE = (
    _CAT_KERNEL
    + """

class ModelNew(nn.Module):
    def forward(self, a, b):
        joined = torch.cat([a, b], dim=1)
        out = torch.empty_like(joined)
        place(joined, out, 0)
        return out
"""
)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cat_results() -> dict[str, EvalResult]:
    """The cat task through the real evaluator on CPU (TRITON_INTERPRET in the sandbox), with
    static checks off so that the glue budget is seen to hold on its own."""
    task = task_from_source(CAT_TASK, "cat_rows")
    evaluator = Evaluator(EvalConfig(device="cpu", spare_children=0, static_checks=False))
    try:
        return {
            name: evaluator.evaluate(task, f"```python\n{source}```\n")
            for name, source in (("kernel", CAT_BY_KERNEL), ("glue", CAT_BY_GLUE))
        }
    finally:
        evaluator.close()


def test_a_data_movement_task_done_by_its_own_kernel_is_correct(
    cat_results: dict[str, EvalResult],
) -> None:
    assert cat_results["kernel"].status is Status.CORRECT, cat_results["kernel"].feedback


def test_a_data_movement_task_done_by_torch_glue_is_caught(
    cat_results: dict[str, EvalResult],
) -> None:
    result = cat_results["glue"]
    assert result.status is Status.INTEGRITY_VIOLATION, result.feedback
    assert result.checks_failed == ["glue_budget"]
    # and statically: the reference's own copying op is the task there
    names = {f.name for f in run_static_checks(CAT_BY_GLUE, "triton", CAT_TASK)}
    assert names == {"torch_fallback"}
    assert run_static_checks(CAT_BY_KERNEL, "triton", CAT_TASK) == []


def test_glue_is_measured_against_the_data_the_task_moves() -> None:
    """A clone of the transposed input is the whole permutation, though a small share of a
    call's bytes when the output repeats it several times: glue is held to the smaller of the
    inputs and outputs, the data a data-movement task moves."""
    evidence = CallEvidence()
    base = {"launches": 1, "flags": [], "compute_ops": {}, "tampered": []}
    output = [{"kind": "tensor", "dtype": "float32", "shape": [8, 64], "nbytes": 8000}]
    evidence.add({**base, "io_bytes": 10_000, "copied_bytes": 400, "outputs": output})
    assert dynamic_checks.check_calls(evidence, "triton") == []
    evidence.add({**base, "io_bytes": 10_000, "copied_bytes": 2000, "outputs": output})
    assert _names(dynamic_checks.check_calls(evidence, "triton")) == {"glue_budget"}


def _host_copies(*copies: tuple[str, int | None, float]) -> list[dict]:
    return [{"name": n, "bytes": b, "us": us} for n, b, us in copies]


def test_host_copies_beyond_a_few_scalars_are_host_compute() -> None:
    kernels = [("relu_kernel", 100.0, 7)] * 5
    profile = _profile(kernels)
    summary = dynamic_checks.summarize_profile(profile, ["relu_kernel"])
    profile["host_copies"] = _host_copies(*[("Memcpy DtoH (Device -> Pageable)", 4, 2.0)] * 10)
    assert dynamic_checks.check_gpu_profile(profile, summary, 0.11) == []  # scalar reads
    out, back = "Memcpy DtoH (Device -> Pageable)", "Memcpy HtoD (Pageable -> Device)"
    profile["host_copies"] = _host_copies(*[(out, 2**22, 400.0), (back, 2**22, 400.0)] * 5)
    violations = dynamic_checks.check_gpu_profile(profile, summary, 0.11)
    assert _names(violations) == {"host_compute"}
    assert "DtoH" in violations[0][1] and "HtoD" in violations[0][1]


def test_a_host_copy_of_unknown_size_is_sized_from_its_duration() -> None:
    kernels = [("relu_kernel", 100.0, 7)] * 5
    profile = _profile(kernels)
    summary = dynamic_checks.summarize_profile(profile, ["relu_kernel"])
    profile["host_copies"] = _host_copies(("Memcpy DtoH (Device -> Pinned)", None, 2.0))
    assert dynamic_checks.check_gpu_profile(profile, summary, 0.11) == []
    profile["host_copies"] = _host_copies(("Memcpy DtoH (Device -> Pinned)", None, 2000.0))
    assert _names(dynamic_checks.check_gpu_profile(profile, summary, 0.11)) == {"host_compute"}


def test_global_state_changes_are_said_as_what_they_are() -> None:
    from kernelrl.env.integrity.failure import GLOBAL_STATE

    state = f"{GLOBAL_STATE}: default dtype torch.float32 -> torch.float64"
    assert _names(dynamic_checks.check_tampering([state])) == {"global_state"}
    both = dynamic_checks.check_tampering([state, "time.perf_counter"])
    assert _names(both) == {"global_state", "harness_tampered"}
    assert "default dtype" in dict(both)["global_state"]
    assert "default dtype" not in dict(both)["harness_tampered"]


def test_the_guard_sees_torch_state_change_and_names_it() -> None:
    import torch

    from kernelrl.env.integrity.audit import TamperGuard

    guard = TamperGuard([], [])
    assert guard.verify() == []
    torch.set_default_dtype(torch.float64)
    torch.set_flush_denormal(True)
    try:
        changed = guard.verify()
    finally:
        torch.set_default_dtype(torch.float32)
        torch.set_flush_denormal(False)
    assert _names(dynamic_checks.check_tampering(changed)) == {"global_state"}
    assert any("default dtype" in c for c in changed)
    assert any("denormals flushed" in c for c in changed)
    assert guard.verify() == []


@pytest.fixture(scope="module")
def transpose_repeat_results() -> dict[str, EvalResult]:
    """The transpose + repeat task through the real evaluator on CPU, static checks off: the
    dynamic checks must hold on their own."""
    task = task_from_source(movement.TASK, "transpose_repeat")
    solutions = {"kernel": movement.BY_KERNEL}
    solutions.update({name: movement.glue_solution(b) for name, b in movement.BY_GLUE.items()})
    evaluator = Evaluator(EvalConfig(device="cpu", spare_children=0, static_checks=False))
    try:
        return {
            name: evaluator.evaluate(task, f"```python\n{source}```\n")
            for name, source in solutions.items()
        }
    finally:
        evaluator.close()


def test_a_repeat_is_data_movement() -> None:
    assert dynamic_checks.glue_can_be_the_task(movement.TASK)


def test_transpose_repeat_by_its_own_kernel_is_correct(
    transpose_repeat_results: dict[str, EvalResult],
) -> None:
    result = transpose_repeat_results["kernel"]
    assert result.status is Status.CORRECT, result.feedback
    assert run_static_checks(movement.BY_KERNEL, "triton", movement.TASK) == []


@pytest.mark.parametrize("spelling", sorted(movement.BY_GLUE))
def test_transpose_repeat_done_by_torch_is_caught(
    spelling: str, transpose_repeat_results: dict[str, EvalResult]
) -> None:
    result = transpose_repeat_results[spelling]
    assert result.status is Status.INTEGRITY_VIOLATION, result.feedback
    assert set(result.checks_failed) & {"glue_budget", "torch_fallback_runtime"}, result.feedback
