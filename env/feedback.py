"""Short, model-readable feedback for one EvalResult: what happened and what to fix."""

from __future__ import annotations

from kernelrl.env.result import EvalResult, Status

MAX_ERROR_CHARS = 1200

_HEADLINES = {
    Status.FORMAT_ERROR: "Your answer could not be used: no valid ModelNew code block.",
    Status.INTEGRITY_VIOLATION: "Rejected by integrity checks: {checks}.",
    Status.COMPILE_ERROR: "Your kernel failed to compile.",
    Status.RUNTIME_ERROR: "Your kernel crashed at run time.",
    Status.TIMEOUT: "Your solution exceeded the time limit.",
    Status.INCORRECT: "Your kernel ran but its output is wrong.",
    Status.CORRECT: "Your kernel is correct.",
    Status.NOT_RUN: "Your code compiled, but this machine cannot run it (it needs a GPU).",
    Status.HARNESS_ERROR: (
        "The evaluation harness failed; this says nothing about your kernel and is not scored."
    ),
}


def _excerpt(text: str) -> str:
    text = text.strip()
    if len(text) <= MAX_ERROR_CHARS:
        return text
    return "...\n" + text[-MAX_ERROR_CHARS:]


def build_feedback(result: EvalResult) -> str:
    lines = [_HEADLINES[result.status].format(checks=", ".join(result.checks_failed) or "none")]
    if result.error:
        lines.append(_excerpt(result.error))
    if result.status is Status.CORRECT:
        lines.extend(_timing_lines(result))
    return "\n".join(lines)


def _timing_lines(result: EvalResult) -> list[str]:
    if result.runtime is None:
        return []
    runtime = result.runtime
    if not result.timing_meaningful:
        shared = result.sandbox.get("gpu_shared_with")
        unknown = result.sandbox.get("gpu_sharing_unknown")
        why = f"other evaluators (pids {shared}) used the GPU" if shared else "Triton interpreter"
        if unknown and not shared:
            why = f"whether other evaluators used the GPU is unknown: {unknown}"
        return [f"Timing on {result.device_name} ({why}) is not meaningful; correctness only."]
    lines = [
        f"Runtime {runtime.median_ms:.4f} ms (median of {runtime.reps}, IQR {runtime.spread:.1%}) on {result.device_name}."
    ]
    parts = []
    if result.ref_eager is not None and result.speedup_vs_eager is not None:
        parts.append(
            f"{result.speedup_vs_eager:.2f}x vs PyTorch eager ({result.ref_eager.median_ms:.4f} ms)"
        )
    if result.ref_compile is not None and result.speedup_vs_compile is not None:
        parts.append(
            f"{result.speedup_vs_compile:.2f}x vs torch.compile ({result.ref_compile.median_ms:.4f} ms)"
        )
    if parts:
        lines.append("Speedup: " + "; ".join(parts) + ".")
    if result.own_kernel_share is not None:
        lines.append(f"Your own kernels took {result.own_kernel_share:.0%} of the GPU time.")
        others = [k for k in result.kernels if not k["own"]][:3]
        if others:
            names = ", ".join(k["name"][:50] for k in others)
            lines.append(f"Other kernels that ran: {names}.")
    return lines
