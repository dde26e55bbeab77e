"""Integrity checks on what actually happened while the solution ran.

Static checks read the source; these read the evidence the sandbox collected (launch counts,
the aten ops forward dispatched, the CUPTI kernel trace) and the trusted side's own
observations. Each check has a name that appears in ``EvalResult.checks_failed``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kernelrl.env.backends import get_backend
from kernelrl.env.integrity.failure import GLOBAL_STATE
from kernelrl.env.integrity.vocabulary import is_trivial_gpu_kernel

DYNAMIC_CHECKS: dict[str, str] = {
    "no_kernel_executed": "every forward call must launch at least one of the solution's own kernels",
    "torch_fallback_runtime": "forward may allocate, view, copy, cast and pad with torch, nothing else: every other aten op or torch GPU kernel is torch doing the work that belongs in the solution's kernels",
    "glue_budget": "in a task whose reference only moves data (cat, a broadcasting copy_, permute + contiguous), torch copies may not do the moving: bounded in bytes copied per call and in share of GPU time; elsewhere cast and layout glue around the solution's kernels only costs runtime",
    "harness_tampered": "the solution must leave the harness, torch, timers, sockets and the audit as they were: no patched functions, replaced modules, trace hooks or removed dispatch modes",
    "global_state": "torch's process-wide state must stay as the sandbox set it: the default dtype and device, torch.backends flags (allow_tf32...), deterministic algorithms, float32 matmul precision, denormal flushing",
    "host_compute": "the work must be done on the GPU by the solution's own kernels: copies between the device and the host beyond a few scalars per call move the task to host code no check sees",
    "init_compute": "importing the solution and its constructor may initialise parameters as the task's Model does, nothing more: torch compute at import or construction (a lookup table, a precomputed answer) is work no checked call sees",
    "input_mutated": "forward must leave its inputs unchanged",
    "output_aliases_input": "an output must not share memory with an input",
    "output_reused": "each call must return fresh outputs: no buffer handed out twice, no result cached across calls",
    "side_stream": "all GPU work must run on the caller's current stream, where it is timed",
    "timing_unconfirmed": "the timed runtime must agree with the GPU time the profiler saw (CUPTI) and with what the trusted side observed: events cannot be skipped, calls cannot be left out",
}

# The event-timed median may exceed the profiled kernel time (launch gaps, cold L2) but should
# not fall far below it; below this fraction the events missed work.
MIN_EVENT_TO_KERNEL_RATIO = 0.7
# The glue budget applies only where glue can be the task: the reference itself only moves
# data (``compute_checks.is_data_movement``). Elsewhere casts and layout copies around the
# solution's own kernels are paid for in the measured runtime and are not cheating.
# Bytes torch glue may copy per call in such a task, as a share of the data the task moves
# (the smaller of the call's input and output bytes): a ``cat``, broadcast ``copy_`` or
# ``clone`` of a permuted view done by torch copies at least that much, once; a kernel that
# does the moving leaves glue a small remainder.
GLUE_BYTES_PER_MOVED_BYTE = 0.25
# Largest share of a call's GPU time that torch's trivial copy/fill kernels may take there.
MAX_GLUE_GPU_SHARE = 0.25
# Bytes a call may copy between the GPU and the host (both ways together): scalars read into
# Python or handed to a kernel, a small table of offsets. Computing the task on the host
# copies its inputs there and its outputs back: megabytes at any published size.
HOST_COPY_BYTES_PER_CALL = 64 * 1024
# A copy whose size the profiler does not report is taken to run at this rate (bytes per
# microsecond: 1 GB/s, below any PCIe link's, so a copy is never taken for smaller than it is).
HOST_COPY_BYTES_PER_US = 1000.0


@dataclass
class CallEvidence:
    """What the audited correctness calls showed, accumulated over the input sets."""

    launches: list[int] = field(default_factory=list)
    flags: set[str] = field(default_factory=set)
    compute_ops: Counter[str] = field(default_factory=Counter)
    copied_bytes: list[int] = field(default_factory=list)
    # Per call, the bytes a data-movement task moves: the smaller of its inputs' and its
    # outputs' (the outputs as described for the comparison, the inputs what remains of the
    # call's input and output bytes); all of them where no output is described.
    moved_bytes: list[int] = field(default_factory=list)
    tampered: list[str] = field(default_factory=list)

    def add(self, report: dict[str, Any]) -> None:
        self.launches.append(int(report["launches"]))
        self.flags.update(str(f) for f in report["flags"])
        self.compute_ops.update({str(k): int(v) for k, v in report["compute_ops"].items()})
        self.copied_bytes.append(int(report["copied_bytes"]))
        io = int(report["io_bytes"])
        described = [o for o in report.get("outputs", []) if o.get("kind") == "tensor"]
        out = sum(int(o["nbytes"]) for o in described)
        self.moved_bytes.append(min(io - out, out) if described and out <= io else io)
        self.tampered.extend(str(t) for t in report["tampered"])


def check_init_compute(
    solution_ops: Mapping[str, int], reference_ops: frozenset[str]
) -> list[tuple[str, str]]:
    """Compute ops that importing the solution module and building its model dispatched (the
    sandbox audits both as one) that building the reference does not."""
    extra = sorted(set(solution_ops) - reference_ops)
    if not extra:
        return []
    return [
        (
            "init_compute",
            f"the module's import or the constructor computed with torch ({', '.join(extra[:5])})"
            " beyond what the task's Model does to initialise its parameters; compute in your "
            "kernels instead",
        )
    ]


def check_tampering(tampered: list[str]) -> list[tuple[str, str]]:
    """The guard's findings: torch's process-wide state changed (``global_state``, said as
    what it is), or the harness itself (``harness_tampered``)."""
    state = sorted({t.split(": ", 1)[-1] for t in tampered if t.startswith(GLOBAL_STATE)})
    harness = sorted({t for t in tampered if not t.startswith(GLOBAL_STATE)})
    violations = []
    if state:
        violations.append(
            (
                "global_state",
                "the solution changed torch's process-wide state ("
                + "; ".join(state[:4])
                + "): the sandbox makes the inputs and reads the outputs under it; leave "
                "torch's defaults and backend flags as they are",
            )
        )
    if harness:
        violations.append(("harness_tampered", "changed: " + ", ".join(harness[:6])))
    return violations


def check_calls(
    evidence: CallEvidence, backend: str, *, glue_is_task: bool = True
) -> list[tuple[str, str]]:
    """Violations visible from the audited correctness calls (both devices).

    ``glue_is_task`` (``glue_can_be_the_task`` of the task's reference) turns on the glue
    budget; left out, it is on, the strict side for a caller that does not know the task."""
    violations = check_tampering(evidence.tampered)
    violations += [(flag, DYNAMIC_CHECKS[flag]) for flag in sorted(evidence.flags)]
    spec = get_backend(backend)
    if spec.counts_launches and any(n == 0 for n in evidence.launches):
        calls = ", ".join(str(n) for n in evidence.launches)
        violations.append(
            (
                "no_kernel_executed",
                f"own {spec.display_name} kernel launches per forward call were [{calls}]; "
                "every call must launch one",
            )
        )
    violations.extend(_aten_fallback(evidence.compute_ops))
    violations.extend(_glue_bytes(evidence, glue_is_task))
    return violations


def glue_can_be_the_task(reference_source: str | None) -> bool:
    """True when the task's reference only moves data, so torch glue could do its work; an
    unknown reference counts as one (the strict side)."""
    from kernelrl.env.integrity.compute_checks import is_data_movement, reference_ops

    if not reference_source:
        return True
    return is_data_movement(reference_ops(reference_source))


def _glue_bytes(evidence: CallEvidence, glue_is_task: bool) -> list[tuple[str, str]]:
    """In a data-movement task, torch copies that move a large share of the data the task
    moves are torch doing the task; in any other task they only cost runtime."""
    if not glue_is_task:
        return []
    for copied, moved in zip(evidence.copied_bytes, evidence.moved_bytes, strict=True):
        if copied > GLUE_BYTES_PER_MOVED_BYTE * max(moved, 1):
            return [
                (
                    "glue_budget",
                    f"the task only moves data, and torch copies/casts/padding moved {copied} "
                    f"bytes in one call, more than {GLUE_BYTES_PER_MOVED_BYTE:g}x the {moved} "
                    "bytes the task moves (the smaller of its inputs and outputs): move the data "
                    "in your kernel",
                )
            ]
    return []


def check_stopped_call(report: dict[str, Any]) -> list[tuple[str, str]]:
    """A checked call the audit stopped at its first torch compute op (``ComputeSeen``)."""
    violations = check_tampering([str(t) for t in report["tampered"]])
    return violations + _aten_fallback({str(k): int(v) for k, v in report["compute_ops"].items()})


def check_timing_report(
    report: dict[str, Any], backend: str, wall_s: float
) -> list[tuple[str, str]]:
    """The timing phase: spot audits, and the child's claims against each other and against
    the wall clock the trusted side read around the whole phase."""
    violations = check_tampering([str(t) for t in report["tampered"]])
    violations += _aten_fallback({str(k): int(v) for k, v in report["compute_ops"].items()})
    runtime = report["runtime"]
    calls, launches = int(report["timed_calls"]), int(report["timed_launches"])
    reps = int(runtime["reps"])
    if calls < reps:
        violations.append(
            ("timing_unconfirmed", f"{reps} timed samples reported from {calls} calls")
        )
    if get_backend(backend).counts_launches and launches < calls:
        violations.append(
            (
                "no_kernel_executed",
                f"{launches} own kernel launches in {calls} timed calls: every call must launch one",
            )
        )
    if float(runtime["min_ms"]) * reps > wall_s * 1e3 * 1.05 + 1.0:
        violations.append(
            (
                "timing_unconfirmed",
                f"{reps} samples of at least {float(runtime['min_ms']):.4f} ms reported in "
                f"{wall_s:.3f} s of wall clock",
            )
        )
    return violations


def check_cpu_profile(profile: dict[str, Any]) -> list[tuple[str, str]]:
    """Every timed call on CPU, under the profiler: torch compute the dispatch-mode audit did not
    see, because the solution ran it only on calls it took for unwatched (by counting calls, or
    by probing for the audit)."""
    return _aten_fallback(profile.get("aten_ops", {}))


def _aten_fallback(aten_ops: Mapping[str, int]) -> list[tuple[str, str]]:
    """Aten ops outside the vocabulary's glue allow-list, from the audit's dispatch mode (every
    correctness call, spot-audited timed calls) or the profiler's CPU events (GPU)."""
    if not aten_ops:
        return []
    ops = ", ".join(f"{name} x{count}" for name, count in sorted(aten_ops.items())[:8])
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
    own_us = total_us = glue_us = 0.0
    own_launches = 0
    foreign: set[str] = set()
    for kernel in profile["kernels"]:
        own = is_own_kernel(kernel["name"], own_names)
        if not own:
            if is_trivial_gpu_kernel(kernel["name"]):
                glue_us += kernel["us"]
            else:
                foreign.add(kernel["name"])
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
        "glue_share": glue_us / total_us if total_us > 0 else 0.0,
        "foreign_kernels": sorted(foreign),
    }


def check_gpu_profile(
    profile: dict[str, Any],
    summary: dict[str, Any],
    runtime_median_ms: float,
    *,
    glue_is_task: bool = True,
    timed_alone: bool = True,
) -> list[tuple[str, str]]:
    """``timed_alone``: no other process used the GPU during the measurement. Only then must
    the timed runtime agree with the profiled kernel time: another process's kernels stretch
    either one (time-slicing), which says nothing about the solution; its timing is then not
    used (EvalResult.timing_meaningful), so there is no speed claim to confirm."""
    violations = _aten_fallback(profile.get("aten_ops", {}))
    if summary["own_launches_per_call"] < 1:
        names = ", ".join(k["name"][:60] for k in summary["kernels"][:5]) or "none"
        violations.append(
            (
                "no_kernel_executed",
                f"the profiler saw no kernel of the solution's own in {profile['calls']} calls (kernels seen: {names})",
            )
        )
    if summary["foreign_kernels"]:
        names = ", ".join(name[:80] for name in summary["foreign_kernels"][:4])
        violations.append(
            (
                "torch_fallback_runtime",
                f"GPU kernels that are neither the solution's own nor torch copies/fills ran: {names}",
            )
        )
    if glue_is_task and summary["glue_share"] > MAX_GLUE_GPU_SHARE:
        violations.append(
            (
                "glue_budget",
                f"the task only moves data, and torch copy/fill kernels took "
                f"{summary['glue_share']:.0%} of the GPU time of a call (at most "
                f"{MAX_GLUE_GPU_SHARE:.0%}): move the data in your kernel",
            )
        )
    violations.extend(_host_copies(profile))
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
    if timed_alone and kernel_ms > 0 and runtime_median_ms < MIN_EVENT_TO_KERNEL_RATIO * kernel_ms:
        violations.append(
            (
                "timing_unconfirmed",
                f"timed {runtime_median_ms:.4f} ms per call but the profiler saw {kernel_ms:.4f} ms of GPU work per call",
            )
        )
    return violations


def _host_copies(profile: dict[str, Any]) -> list[tuple[str, str]]:
    """Copies between the GPU and the host in the profiled calls: beyond a few scalars per
    call, the work left the GPU for host code (copied out, computed there, copied back), which
    neither the audit nor the kernel profile sees."""
    copies = profile.get("host_copies", [])
    if not copies:
        return []
    total = sum(
        int(c["bytes"]) if c.get("bytes") is not None else float(c["us"]) * HOST_COPY_BYTES_PER_US
        for c in copies
    )
    per_call = total / max(int(profile["calls"]), 1)
    if per_call <= HOST_COPY_BYTES_PER_CALL:
        return []
    kinds = ", ".join(sorted({str(c["name"]).split(" (")[0] for c in copies}))
    return [
        (
            "host_compute",
            f"the profiled calls copied {per_call:.0f} bytes per call between the GPU and the "
            f"host ({kinds}; at most {HOST_COPY_BYTES_PER_CALL} allowed): compute on the GPU in "
            "your kernels, not in host code",
        )
    ]
