"""Output comparison, done only on the trusted side against trusted references."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from kernelrl.env.task import Task


@dataclass
class Comparison:
    correct: bool
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    problems: list[str] = field(default_factory=list)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def compare_outputs(task: Task, got: list[Any], expected: list[Any], set_index: int) -> Comparison:
    """Check count, type, shape, dtype, finiteness and values of one input set's outputs."""
    result = Comparison(correct=True)
    where = f"input set {set_index}"
    if len(got) != len(expected):
        return Comparison(
            False, problems=[f"{where}: returned {len(got)} outputs, expected {len(expected)}"]
        )
    for k, (out, ref) in enumerate(zip(got, expected, strict=True)):
        name = f"{where}, output {k}" if len(expected) > 1 else where
        if not isinstance(ref, torch.Tensor):
            if out != ref:
                result.problems.append(f"{name}: returned {out!r}, expected {ref!r}")
            continue
        if not isinstance(out, torch.Tensor):
            result.problems.append(f"{name}: returned {type(out).__name__}, expected a tensor")
            continue
        if tuple(out.shape) != tuple(ref.shape):
            result.problems.append(f"{name}: shape {tuple(out.shape)}, expected {tuple(ref.shape)}")
            continue
        if out.dtype != ref.dtype:
            result.problems.append(
                f"{name}: dtype {_dtype_name(out.dtype)}, expected {_dtype_name(ref.dtype)}"
            )
            continue
        out = out.to(ref.device)
        out_f, ref_f = out.double(), ref.double()
        bad_finite = torch.isfinite(ref_f) & ~torch.isfinite(out_f)
        if bool(bad_finite.any()):
            count = int(bad_finite.sum())
            result.problems.append(f"{name}: {count} NaN/Inf values where the reference is finite")
            continue
        atol, rtol = task.tolerances(_dtype_name(ref.dtype))
        diff = (out_f - ref_f).abs()
        diff = torch.where(
            torch.isfinite(ref_f), diff, torch.where(out_f == ref_f, 0.0, float("inf"))
        )
        limit = atol + rtol * ref_f.abs()
        mismatched = diff > limit
        if diff.numel():
            result.max_abs_err = max(result.max_abs_err, float(diff.max()))
            rel = diff / ref_f.abs().clamp_min(atol)
            result.max_rel_err = max(result.max_rel_err, float(rel.max()))
        if bool(mismatched.any()):
            count = int(mismatched.sum())
            flat = int(mismatched.flatten().nonzero()[0])
            index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), ref.shape))
            result.problems.append(
                f"{name}: {count}/{ref.numel()} values outside atol={atol:g}, rtol={rtol:g}; "
                f"first at index {list(index)}: got {float(out_f.flatten()[flat]):.6g}, "
                f"expected {float(ref_f.flatten()[flat]):.6g}; max abs error {float(diff.max()):.3g}"
            )
    result.correct = not result.problems
    return result
