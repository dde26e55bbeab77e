"""What a reference says beyond answers that ignore the inputs, and how far its own rounding
carries it: the statistics behind ``compare.py``'s information check (docs/threat-model.md,
"What `correct` means").

A *degenerate answer* ignores the inputs along some axis: zeros, one constant, or the mean
along one dimension (constant along it; the row mean is the one along the last). What each
scores against the full reference is computed here in float64, chunk by chunk, on the
reference's device: never a second full copy of a multi-GiB output.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch

from kernelrl.env.compare_kernels import group_sums
from kernelrl.env.sandbox import harness

STATS_CHUNK = 2**23  # elements per float64 step over the reference (64 MiB)
_SAME_WIDTH_INT = {8: torch.int64, 4: torch.int32, 2: torch.int16}


def _answer_dims(shape: tuple[int, ...]) -> list[int]:
    """Dimensions along which 'constant along it' is an answer of its own, the last first:
    longer than 1, and not the whole tensor (that answer is the global constant)."""
    numel = math.prod(shape)
    dims = [d for d, size in enumerate(shape) if 1 < size < numel]
    return sorted(dims, key=lambda d: d != len(shape) - 1)


def degenerate_answers(shape: tuple[int, ...]) -> list[tuple[str, int]]:
    """The degenerate answers an output of ``shape`` is measured against, in the order of
    ``degenerate_errors``' last entries, each with the number of constants it fits."""
    numel = math.prod(shape)
    return [("zeros", 0), ("a constant (the mean of all values)", 1)] + [
        (
            "the row mean (constant along the last dimension)"
            if d == len(shape) - 1
            else f"the mean along dimension {d} (constant along it)",
            numel // shape[d],
        )
        for d in _answer_dims(shape)
    ]


def degenerate_errors(reference: torch.Tensor) -> torch.Tensor:
    """[finite count, sum of squares, then the squared error of each of
    ``degenerate_answers(reference.shape)``], in float64 on the reference's device, over its
    finite values; every answer is the best of its kind in L2 (the mean, where it is constant).

    Two passes per answer (``compare_kernels.group_sums``, one read of each value on a GPU):
    the mean first, then the error around it, so an output constant along rows scores its
    rounding and not the cancellation of a one-pass formula. Nothing here waits for the
    device."""
    flat = reference.reshape(1, -1, 1)
    count, total, sum_sq = _sums(flat)
    errors = [count, sum_sq, sum_sq, _squared_error(flat, total / count.clamp_min(1))]
    for d in _answer_dims(tuple(reference.shape)):
        errors.append(_group_error(reference, d))
    return torch.stack([e.reshape(()) for e in errors])


def _group_error(reference: torch.Tensor, dim: int) -> torch.Tensor:
    """Squared error of the mean along ``dim``: the reference viewed as (before, dim, after),
    in tiles of whole groups (a block of 'before' x a block of 'after')."""
    shape = reference.shape
    view = reference.reshape(math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1 :]))
    error = torch.zeros((), dtype=torch.float64, device=reference.device)
    for tile in _tiles(*view.shape):
        part = view[tile]
        count, total, _ = _sums(part)
        error = error + _squared_error(part, total / count.clamp_min(1))
    return error


def _tiles(before: int, length: int, after: int) -> Iterator[tuple[slice, slice, slice]]:
    """Index tuples of an (before, length, after) view whose groups (one per before x after
    position) number at most ``STATS_CHUNK`` each."""
    after_step = min(after, STATS_CHUNK)
    before_step = max(1, min(before, STATS_CHUNK // after_step))
    for b in range(0, before, before_step):
        for a in range(0, after, after_step):
            yield slice(b, b + before_step), slice(None), slice(a, a + after_step)


def _sums(view: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per group (before x after), over finite values: count, sum and sum of squares."""
    return group_sums(view, step_elements=STATS_CHUNK)


def _squared_error(view: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    """Sum over finite values of (value - its group's mean)^2; ``mean``: (before, 1, after)."""
    return group_sums(view, mean, step_elements=STATS_CHUNK)[2].sum()


def rms_difference(reference: torch.Tensor, other: torch.Tensor, count: float) -> float:
    """RMS of ``other - reference`` over the reference's finite values, chunk by chunk; NaN in
    ``other`` where the reference is finite counts as infinitely far."""
    total = torch.zeros((), dtype=torch.float64, device=reference.device)
    for start in range(0, reference.numel(), STATS_CHUNK):
        ref = reference[start : start + STATS_CHUNK].double()
        out = other[start : start + STATS_CHUNK].to(ref.device).double()
        diff = torch.where(torch.isfinite(ref), (out - ref).nan_to_num(nan=math.inf), 0.0)
        total = total + diff.square().sum()
    return math.sqrt(float(total) / max(count, 1.0))


def nudge_inputs(inputs: list[Any], seed: int) -> None:
    """Move every finite, nonzero floating value of ``inputs`` by one ulp, up or down in
    magnitude at random (its bits as an integer, plus or minus one), in place and chunk by
    chunk: no second copy of a large input."""
    for x in inputs:
        if not (isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel()):
            continue
        generator = torch.Generator(device=x.device).manual_seed(seed)
        largest = torch.finfo(x.dtype).max
        for part in x.view(-1).split(STATS_CHUNK) if x.is_contiguous() else [x]:
            bits = part.view(_SAME_WIDTH_INT[part.element_size()])
            step = torch.randint(
                0, 2, part.shape, generator=generator, device=x.device, dtype=bits.dtype
            )
            movable = torch.isfinite(part) & (part != 0) & (part.abs() < largest)
            bits.add_(torch.where(movable, step * 2 - 1, 0))


def rerolled_reference(
    module: types.ModuleType, model: torch.nn.Module, seed: int, device: torch.device
) -> list[Any]:
    """The reference's outputs on the inputs of ``seed`` moved by one ulp: how far the
    reference's own rounding (and conditioning) carries it, which no check can see below.
    Trusted task code only, as ``ReferenceRunner.output``."""
    inputs = harness.make_inputs(module, seed, device)
    nudge_inputs(inputs, seed)
    with torch.no_grad():
        return harness.as_output_list(model(*inputs))


def reference_rerun(
    runner: Any,
    task: Any,
    model: torch.nn.Module,
    seed: int,
    lock: Callable[[], AbstractContextManager[Any]],
) -> Callable[[], list[Any]]:
    """``rerolled_reference`` of a trusted task's reference (``ReferenceRunner`` ``runner``),
    for ``OutputMatcher``'s ``rerun``: computed only when asked, inside ``lock()`` (the
    evaluator's trusted GPU work)."""

    def rerun() -> list[Any]:
        with lock():
            return rerolled_reference(runner.module(task), model, seed, runner.device)

    return rerun
