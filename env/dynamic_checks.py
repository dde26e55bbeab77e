"""Integrity checks on what actually happened while the solution ran.

Static checks read the source; these read the evidence the sandbox collected (launch counts,
the aten ops forward dispatched, the CUPTI kernel trace) and the trusted side's own
observations. Each check has a name that appears in ``EvalResult.checks_failed``.
"""

from __future__ import annotations

from typing import Any

DYNAMIC_CHECKS: dict[str, str] = {
    "no_kernel_executed": "every forward call must launch at least one of the solution's own kernels",
    "torch_fallback_runtime": "forward must not dispatch aten compute ops (matmul, conv, softmax, sum, add, ...): the work belongs in the solution's kernels",
    "input_mutated": "forward must leave its inputs unchanged",
    "output_aliases_input": "an output must not share memory with an input",
    "output_reused": "each call must return fresh outputs: no buffer handed out twice, no result cached across calls",
    "side_stream": "all GPU work must run on the caller's current stream, where it is timed",
    "timing_unconfirmed": "the timed runtime must agree with the GPU time the profiler saw (CUPTI): events cannot be skipped",
}

# The event-timed median may exceed the profiled kernel time (launch gaps, cold L2) but should
# not fall far below it; below this fraction the events missed work.
MIN_EVENT_TO_KERNEL_RATIO = 0.7


def check_correctness_run(report: dict[str, Any], backend: str) -> list[tuple[str, str]]:
    """Violations visible from the correctness calls (both devices)."""
    violations = [
        (flag, DYNAMIC_CHECKS[flag]) for flag in report["flags"] if flag in DYNAMIC_CHECKS
    ]
    if backend == "triton" and any(n == 0 for n in report["launches"]):
        calls = ", ".join(str(n) for n in report["launches"])
        violations.append(
            (
                "no_kernel_executed",
                f"own Triton kernel launches per forward call were [{calls}]; every call must launch one",
            )
        )
    violations.extend(_aten_fallback(report["aten_ops"]))
    return violations


def _aten_fallback(aten_ops: dict[str, int]) -> list[tuple[str, str]]:
    """CPU: ops recorded by a dispatch mode on one call; GPU: CPU-side ops in the CUPTI profile."""
    if not aten_ops:
        return []
    ops = ", ".join(f"{name} x{count}" for name, count in sorted(aten_ops.items()))
    return [("torch_fallback_runtime", f"forward dispatched aten compute ops: {ops}")]


def is_own_kernel(kernel_name: str, own_names: list[str]) -> bool:
    """Triton kernels appear under their function name; CUDA ones demangled, 'name(args)'."""
    for name in own_names:
        if (
            kernel_name == name
            or kernel_name.startswith(name + "(")
            or kernel_name.startswith(name + "<")
        ):
            return True
        if f" {name}(" in kernel_name or f"::{name}(" in kernel_name or f" {name}<" in kernel_name:
            return True
    return False


def summarize_profile(profile: dict[str, Any], own_names: list[str]) -> dict[str, Any]:
    """Per-kernel totals, own-kernel share of GPU time and own launches per call."""
    calls = max(int(profile["calls"]), 1)
    per_kernel: dict[str, dict[str, Any]] = {}
    own_us = total_us = 0.0
    own_launches = 0
    for kernel in profile["kernels"]:
        own = is_own_kernel(kernel["name"], own_names)
        entry = per_kernel.setdefault(
            kernel["name"], {"name": kernel["name"], "calls": 0, "total_us": 0.0, "own": own}
        )
        entry["calls"] += 1
        entry["total_us"] += kernel["us"]
        total_us += kernel["us"]
        if own:
            own_us += kernel["us"]
            own_launches += 1
    return {
        "kernels": sorted(per_kernel.values(), key=lambda k: -k["total_us"]),
        "own_share": own_us / total_us if total_us > 0 else 0.0,
        "own_launches_per_call": own_launches / calls,
        "kernel_ms_per_call": total_us / calls / 1e3,
    }


def check_gpu_profile(
    profile: dict[str, Any], summary: dict[str, Any], runtime_median_ms: float
) -> list[tuple[str, str]]:
    violations = _aten_fallback(profile.get("aten_ops", {}))
    if summary["own_launches_per_call"] < 1:
        names = ", ".join(k["name"][:60] for k in summary["kernels"][:5]) or "none"
        violations.append(
            (
                "no_kernel_executed",
                f"the profiler saw no kernel of the solution's own in {profile['calls']} calls (kernels seen: {names})",
            )
        )
    current = profile["current_stream"]
    streams = sorted({k["stream"] for k in profile["kernels"] if k["stream"] != current})
    if streams:
        violations.append(
            (
                "side_stream",
                f"kernels ran on streams {streams}, not on the current stream {current}",
            )
        )
    kernel_ms = summary["kernel_ms_per_call"]
    if kernel_ms > 0 and runtime_median_ms < MIN_EVENT_TO_KERNEL_RATIO * kernel_ms:
        violations.append(
            (
                "timing_unconfirmed",
                f"timed {runtime_median_ms:.4f} ms per call but the profiler saw {kernel_ms:.4f} ms of GPU work per call",
            )
        )
    return violations
