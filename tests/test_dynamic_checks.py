"""The dynamic checks' verdicts on evidence built by hand: what the trusted side concludes from
a child's reports, including claims that contradict each other or the wall clock."""

from __future__ import annotations

from kernelrl.env.integrity import dynamic_checks
from kernelrl.env.integrity.dynamic_checks import CallEvidence


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


def test_glue_bytes_beyond_the_budget_are_flagged() -> None:
    evidence = CallEvidence()
    base = {"launches": 1, "flags": [], "compute_ops": {}, "tampered": [], "io_bytes": 1000}
    evidence.add({**base, "copied_bytes": 1500})
    assert dynamic_checks.check_calls(evidence, "triton") == []
    evidence.add({**base, "copied_bytes": 5000})
    assert _names(dynamic_checks.check_calls(evidence, "triton")) == {"glue_budget"}
