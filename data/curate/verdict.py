"""The verdict on a reference from two sandboxed runs with equal seeds (``reference_probe``).

A reference passes when, on the target device:
- it loads, constructs and runs (no exception, crash, hang or memory blow-up);
- every output is finite;
- a second run in a second child with the same seeds (every input set) agrees with the first
  within the task's own tolerances (a reference that does not reproduce itself cannot grade a
  solution);
- its output depends on its inputs (different input seeds give different outputs; optional);
- it leaves its inputs unchanged (a solution doing the same would fail ``input_mutated``);
- its median runtime is within the budget (optional).
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

import torch

from kernelrl.data.curate.reference_probe import OutputDigest, Probe, ReferenceProber
from kernelrl.env.task import Task

if TYPE_CHECKING:
    from kernelrl.data.curate.validate_config import ValidateConfig


def seeds_for(task: Task, seed: int, input_sets: int) -> tuple[int, list[int]]:
    """Seeds derived from the curation seed and the task's content: reproducible runs."""
    base = int(task.hash[:8], 16) ^ (seed * 0x9E3779B1)
    model_seed = base % (2**31)
    return model_seed, [(base + 7919 * (k + 1)) % (2**31) for k in range(input_sets)]


def _non_finite(outputs: list[list[OutputDigest]]) -> str | None:
    for set_index, values in enumerate(outputs):
        for k, digest in enumerate(values):
            if digest.non_finite:
                numel = math.prod(digest.shape)
                return f"input set {set_index}, output {k}: {digest.non_finite}/{numel} values are NaN or Inf"
    return None


def _same(a: list[OutputDigest], b: list[OutputDigest]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x.is_tensor != y.is_tensor or (x.shape, x.dtype) != (y.shape, y.dtype):
            return False
        if x.is_tensor and not torch.equal(x.sample, y.sample):
            return False
        if not x.is_tensor and x.value != y.value:
            return False
    return True


def _disagreement(
    task: Task, a: list[OutputDigest], b: list[OutputDigest], index: int
) -> tuple[str | None, float]:
    """Where two runs of one input set differ beyond the task's tolerances (sampled values)."""
    if len(a) != len(b):
        return f"input set {index}: {len(a)} vs {len(b)} outputs", 0.0
    worst = 0.0
    for k, (x, y) in enumerate(zip(a, b, strict=True)):
        if (x.shape, x.dtype, x.is_tensor) != (y.shape, y.dtype, y.is_tensor):
            return f"input set {index}, output {k}: shape or type differs", worst
        if not x.is_tensor:
            if x.value != y.value:
                return f"input set {index}, output {k}: {x.value!r} vs {y.value!r}", worst
            continue
        atol, rtol = task.tolerances(x.dtype)
        both_finite = torch.isfinite(x.sample) & torch.isfinite(y.sample)
        diff = torch.where(both_finite, (x.sample - y.sample).abs(), 0.0)
        if diff.numel():
            worst = max(worst, float(diff.max()))
        bad = (diff > atol + rtol * y.sample.abs().nan_to_num()) | (
            ~both_finite & ~(x.sample.isnan() & y.sample.isnan()) & (x.sample != y.sample)
        )
        if bool(bad.any()):
            return (
                f"input set {index}, output {k}: {int(bad.sum())} of {bad.numel()} sampled "
                f"values differ beyond atol={atol:g}, rtol={rtol:g}"
            ), worst
    return None, worst


def judge(
    task: Task, first: Probe, second: Probe, config: ValidateConfig
) -> tuple[str | None, str, dict[str, Any]]:
    """(removal reason or None, detail, validation details) from two runs with equal seeds."""
    for probe in (first, second):
        if probe.failure:
            return probe.failure, probe.detail, {}
    if not any(digest.is_tensor for values in first.outputs for digest in values):
        return "no_tensor_output", "forward returned no tensor", {}
    bad = _non_finite(first.outputs)
    if bad:
        return "non_finite_output", bad, {}
    if "input_mutated" in first.flags:
        return (
            "mutates_inputs",
            "forward changed its inputs in place; a solution doing the same fails input_mutated",
            {},
        )
    max_diff = 0.0
    for index, (a, b) in enumerate(zip(first.outputs, second.outputs, strict=False)):
        problem, diff = _disagreement(task, a, b, index)
        max_diff = max(max_diff, diff)
        if problem:
            detail = "two runs with equal seeds disagree beyond the task's tolerances: " + problem
            return "nondeterministic", detail, {}
    if (
        config.reject_constant_outputs
        and len(first.outputs) >= 2
        and _same(first.outputs[0], first.outputs[1])
    ):
        return (
            "constant_output",
            "different inputs gave identical outputs: the output does not depend on the inputs",
            {},
        )
    details = {
        "runs": 2,
        "input_sets": len(first.outputs),
        "input_sets_repeated": len(second.outputs),
        "max_abs_diff_between_runs": max_diff,
        "flags": sorted(set(first.flags)),
        "network": first.network,
        "phase_seconds": {k: round(v, 4) for k, v in first.phase.items()},
    }
    return None, "", details


def outcome(
    task: Task,
    first: Probe,
    second: Probe,
    seeds: tuple[int, list[int]],
    config: ValidateConfig,
    prober: ReferenceProber,
) -> dict[str, Any]:
    """A task's validation outcome as JSON (what the journal keeps); ``seeds`` are the
    (model seed, input seeds) both runs had."""
    reason, detail, details = judge(task, first, second, config)
    if reason:
        return {"reason": reason, "detail": detail}
    model_seed, input_seeds = seeds
    details.update(device=prober.kind, model_seed=model_seed, input_seeds=input_seeds)
    return {
        "fields": {
            "ref_device": prober.device_name,
            "ref_runtime_ms": first.runtime_ms,
            "aten_ops": sorted(first.aten_ops),
            "validation": json.dumps(details, sort_keys=True),
        }
    }
