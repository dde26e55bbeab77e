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


# Running totals of one output, kept on the reference's device so that comparing a chunk never
# waits for the GPU: the host reads them once, in ``finish``. float64 holds counts and indices
# of up to 2**53 elements exactly.
_MISMATCHED, _NONFINITE, _MAX_DIFF, _MAX_REL, _REF_SCALE, _FIRST_BAD, _FIRST_GOT = range(7)


@dataclass
class _TensorState:
    name: str
    reference: torch.Tensor  # flat view of the reference
    shape: tuple[int, ...]
    atol: float
    rtol: float
    totals: torch.Tensor  # the seven running totals above
    received: int = 0


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
                totals = torch.zeros(7, dtype=torch.float64, device=ref.device)
                totals[_FIRST_BAD] = -1
                self._tensors[k] = _TensorState(name, ref.reshape(-1), shape, atol, rtol, totals)
        return streams

    def add_chunk(self, k: int, chunk: torch.Tensor) -> None:
        """The next elements of output ``k`` (1-D, its dtype, any device). ``chunk`` may be
        reused by the caller as soon as this returns: it is copied first, and nothing after the
        copy waits for the device."""
        state = self._tensors.get(k)
        if state is None or chunk.numel() == 0:
            return
        start = state.received
        state.received += chunk.numel()
        ref = state.reference[start : state.received].double()
        out = chunk.to(state.reference.device).double()
        finite_ref = torch.isfinite(ref)
        nonfinite = (finite_ref & ~torch.isfinite(out)).sum()
        diff = (out - ref).abs()
        diff = torch.where(finite_ref, diff, torch.where(out == ref, 0.0, float("inf")))
        mismatched = diff > state.atol + state.rtol * ref.abs()
        count = mismatched.sum()
        first = torch.argmax(mismatched.to(torch.uint8))  # the first mismatch, if any
        totals = state.totals
        take_first = (count > 0) & (totals[_FIRST_BAD] < 0)
        state.totals = torch.stack(
            [
                totals[_MISMATCHED] + count,
                totals[_NONFINITE] + nonfinite,
                torch.maximum(totals[_MAX_DIFF], diff.max()),
                torch.maximum(totals[_MAX_REL], (diff / ref.abs().clamp_min(state.atol)).max()),
                torch.maximum(totals[_REF_SCALE], torch.where(finite_ref, ref.abs(), 0.0).max()),
                torch.where(take_first, start + first, totals[_FIRST_BAD]),
                torch.where(take_first, out[first], totals[_FIRST_GOT]),
            ]
        )

    def finish(self) -> Comparison:
        for state in self._tensors.values():
            mismatched, nonfinite, max_diff, max_rel, ref_scale, first_bad, first_got = (
                state.totals.tolist()
            )
            self.result.max_abs_err = max(self.result.max_abs_err, max_diff)
            self.result.max_rel_err = max(self.result.max_rel_err, max_rel)
            self.result.ref_scale = max(self.result.ref_scale, ref_scale)
            total = state.reference.numel()
            if state.received != total:
                self.result.problems.append(
                    f"{state.name}: {state.received} of {total} values arrived"
                )
            elif nonfinite:
                self.result.problems.append(
                    f"{state.name}: {int(nonfinite)} NaN/Inf values where the reference is finite"
                )
            elif mismatched:
                first = max(int(first_bad), 0)
                expected = float(state.reference[first].double())
                self.result.problems.append(
                    f"{state.name}: {int(mismatched)}/{total} values outside "
                    f"atol={state.atol:g}, rtol={state.rtol:g}; first at index "
                    f"{_unravel(first, state.shape)}: got {first_got:.6g}, expected "
                    f"{expected:.6g}; max abs error {max_diff:.3g}"
                )
        self.result.correct = not self.result.problems
        return self.result


def _unravel(flat: int, shape: tuple[int, ...]) -> list[int]:
    index = []
    for dim in reversed(shape):
        index.append(flat % dim if dim else 0)
        flat = flat // dim if dim else 0
    return index[::-1]
