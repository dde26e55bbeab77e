"""Output comparison, done only on the trusted side against trusted references.

Outputs arrive from the sandbox as a description (count, types, shapes, dtypes) followed by
their bytes in chunks; ``OutputMatcher`` checks the description first and then each chunk
against the same slice of the reference, keeping only running totals. Memory is one chunk,
however large the task's tensors: a KernelBench level-1 output of 6 GiB is compared without a
second copy of it, in fp64, anywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from kernelrl.env.task import Task

# Output dtypes a solution may return; a description naming anything else is malformed.
DTYPES: dict[str, torch.dtype] = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex64,
        torch.complex128,
    )
}


@dataclass
class Comparison:
    correct: bool
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    problems: list[str] = field(default_factory=list)
    ref_scale: float = 0.0  # largest finite |reference value| compared


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def describe_outputs(outputs: list[Any]) -> list[dict[str, Any]]:
    """What the sandbox sends ahead of the bytes: one entry per output."""
    described = []
    for out in outputs:
        if isinstance(out, torch.Tensor):
            described.append(
                {
                    "kind": "tensor",
                    "dtype": _dtype_name(out.dtype),
                    "shape": list(out.shape),
                    "nbytes": out.numel() * out.element_size(),
                }
            )
        elif isinstance(out, bool | int | float) or out is None:
            described.append({"kind": "value", "value": out})
        else:
            described.append({"kind": "other", "type": type(out).__name__})
    return described


@dataclass
class _TensorState:
    name: str
    reference: torch.Tensor  # flat view of the reference
    shape: tuple[int, ...]
    atol: float
    rtol: float
    received: int = 0
    mismatched: int = 0
    nonfinite: int = 0
    first_bad: int | None = None
    first_got: float = 0.0
    max_diff: float = 0.0


class OutputMatcher:
    """One input set's outputs compared as they arrive, against references the child never saw."""

    def __init__(self, task: Task, expected: list[Any], set_index: int) -> None:
        self.task = task
        self.expected = expected
        self.where = f"input set {set_index}"
        self.result = Comparison(correct=True)
        self._tensors: dict[int, _TensorState] = {}

    def _name(self, k: int) -> str:
        return f"{self.where}, output {k}" if len(self.expected) > 1 else self.where

    def check_description(self, described: list[dict[str, Any]]) -> list[tuple[int, torch.dtype]]:
        """Count, kinds, shapes, dtypes and plain values; returns the tensors whose bytes to
        read (index, dtype), in order. Problems land in ``self.result``."""
        problems = self.result.problems
        if len(described) != len(self.expected):
            problems.append(
                f"{self.where}: returned {len(described)} outputs, expected {len(self.expected)}"
            )
            return []
        streams = []
        for k, (out, ref) in enumerate(zip(described, self.expected, strict=True)):
            name, kind = self._name(k), out.get("kind")
            if not isinstance(ref, torch.Tensor):
                if kind != "value" or out.get("value") != ref:
                    shown = out.get("value") if kind == "value" else out.get("type", kind)
                    problems.append(f"{name}: returned {shown!r}, expected {ref!r}")
                if kind == "tensor":  # its bytes follow all the same
                    streams.append((k, DTYPES.get(str(out.get("dtype")), torch.uint8)))
                continue
            if kind != "tensor":
                problems.append(
                    f"{name}: returned {out.get('type', type(out.get('value')).__name__)}, "
                    "expected a tensor"
                )
                continue
            dtype = DTYPES.get(str(out.get("dtype")))
            shape = tuple(int(d) for d in out.get("shape", ()))
            if dtype is None or int(out.get("nbytes", -1)) != math.prod(shape) * dtype.itemsize:
                raise ValueError(f"{name}: malformed output description {out!r}")
            streams.append((k, dtype))
            if shape != tuple(ref.shape):
                problems.append(f"{name}: shape {shape}, expected {tuple(ref.shape)}")
            elif dtype != ref.dtype:
                problems.append(
                    f"{name}: dtype {_dtype_name(dtype)}, expected {_dtype_name(ref.dtype)}"
                )
            else:
                atol, rtol = self.task.tolerances(_dtype_name(ref.dtype))
                self._tensors[k] = _TensorState(name, ref.reshape(-1), shape, atol, rtol)
        return streams

    def add_chunk(self, k: int, chunk: torch.Tensor) -> None:
        """The next elements of output ``k`` (1-D, its dtype, any device)."""
        state = self._tensors.get(k)
        if state is None:
            return
        start = state.received
        state.received += chunk.numel()
        ref = state.reference[start : state.received].double()
        out = chunk.to(state.reference.device).double()
        finite_ref = torch.isfinite(ref)
        bad_finite = finite_ref & ~torch.isfinite(out)
        state.nonfinite += int(bad_finite.sum())
        diff = (out - ref).abs()
        diff = torch.where(finite_ref, diff, torch.where(out == ref, 0.0, float("inf")))
        mismatched = diff > state.atol + state.rtol * ref.abs()
        finite_abs = torch.where(finite_ref, ref.abs(), 0.0)
        if finite_abs.numel():
            self.result.ref_scale = max(self.result.ref_scale, float(finite_abs.max()))
        if diff.numel():
            state.max_diff = max(state.max_diff, float(diff.max()))
            self.result.max_abs_err = max(self.result.max_abs_err, float(diff.max()))
            rel = diff / ref.abs().clamp_min(state.atol)
            self.result.max_rel_err = max(self.result.max_rel_err, float(rel.max()))
        count = int(mismatched.sum())
        if count and state.first_bad is None:
            local = int(mismatched.nonzero()[0])
            state.first_bad, state.first_got = start + local, float(out[local])
        state.mismatched += count

    def finish(self) -> Comparison:
        for state in self._tensors.values():
            total = state.reference.numel()
            if state.received != total:
                self.result.problems.append(
                    f"{state.name}: {state.received} of {total} values arrived"
                )
            elif state.nonfinite:
                self.result.problems.append(
                    f"{state.name}: {state.nonfinite} NaN/Inf values where the reference is finite"
                )
            elif state.mismatched:
                index = _unravel(state.first_bad or 0, state.shape)
                expected = float(state.reference[state.first_bad or 0].double())
                self.result.problems.append(
                    f"{state.name}: {state.mismatched}/{total} values outside "
                    f"atol={state.atol:g}, rtol={state.rtol:g}; first at index {index}: "
                    f"got {state.first_got:.6g}, expected {expected:.6g}; "
                    f"max abs error {state.max_diff:.3g}"
                )
        self.result.correct = not self.result.problems
        return self.result


def _unravel(flat: int, shape: tuple[int, ...]) -> list[int]:
    index = []
    for dim in reversed(shape):
        index.append(flat % dim if dim else 0)
        flat = flat // dim if dim else 0
    return index[::-1]
