"""Output comparison, done only on the trusted side against trusted references.

Outputs arrive from the sandbox as a description (count, types, shapes, dtypes) followed by
their bytes in chunks; ``OutputMatcher`` checks the description first and then each chunk
against the same slice of the reference, keeping only running totals. Memory is one chunk,
however large the task's tensors: a KernelBench level-1 output of 6 GiB is compared without a
second copy of it, in fp64, anywhere.

Two checks decide a floating-point output. The elementwise tolerance (``Task.tolerances``, as
KernelBench) alone passes answers that say nothing: every value of a softmax over 393216
columns is below its atol, so zeros pass it. The information check therefore asks the output's
RMS error to be a small fraction of what the best *degenerate* answer would score, an answer
that ignores the inputs along some axis: zeros, one constant, or the mean along one dimension
(the row mean is the one along the last). What those answers score is computed from the full
reference, chunk by chunk (``information.py``); a degenerate answer that scores at the rounding
floor is not degenerate (it is the answer: an output constant along rows) and sets no bound.
Before an output fails this check alone, the reference is rerun on its inputs moved by one ulp:
where that moves it about as far as the output is off, the reference is noise at that level
(an output that is zero but for rounding) and the check cannot judge. docs/threat-model.md,
"What `correct` means", gives the rule and its constants.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from kernelrl.env.compare_kernels import TRITON_DTYPES, chunk_partials, combine, totals
from kernelrl.env.information import degenerate_answers, degenerate_errors, rms_difference
from kernelrl.env.task import Task

# Output dtypes a solution may return; a description naming anything else is malformed.
DTYPES: dict[str, torch.dtype] = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (*TRITON_DTYPES, torch.complex64, torch.complex128)
}

# The information check. An output's RMS error must be at most INFORMATION_RATIO of the best
# degenerate answer's, or within the rounding floor, whichever is larger. 0.1: the answer
# explains 99% of what the best degenerate one leaves unexplained; the bundled and KernelBench
# solutions stay over 10**4 times under the bound, TF32 and fp16 accumulation on a matmul over
# 100 times (docs/threat-model.md, "What `correct` means").
INFORMATION_RATIO = 0.1
# The rounding floor, relative to the reference's RMS: ulps of the output's own dtype (a fused
# kernel rounds once where eager rounds after every op) plus reassociated arithmetic in the
# precision kernels compute in (fp32, or fp64 for fp64 outputs). fp32: 4.3e-6, fp16: 3.9e-3,
# bf16: 3.1e-2 of the reference's RMS.
FLOOR_OUTPUT_ULPS = 4.0
FLOOR_COMPUTE_EPS = 32.0
# An output whose error is within NOISE_FACTOR times the reference's own movement under one-ulp
# changes of its inputs is not judged by the information check: the reference is noise there.
NOISE_FACTOR = 10.0
_FLOATS = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


@dataclass
class Comparison:
    correct: bool
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    problems: list[str] = field(default_factory=list)
    ref_scale: float = 0.0  # largest finite |reference value| compared
    # The information check, for the output that did worst at it (None: no output had a
    # degenerate answer to measure against, e.g. integer outputs or an all-zero reference).
    information_ratio: float | None = None  # RMS error / the best degenerate answer's
    rms_err: float | None = None  # that output's RMS error over finite reference values
    degenerate_rms: float | None = None  # the best degenerate answer's RMS error
    degenerate_answer: str = ""  # which answer that is ("zeros", "the row mean ...")
    information_bound: float | None = None  # the largest RMS error accepted
    uninformative: int = 0  # how many of ``problems`` are the information check's
    # RMS change of the reference under one-ulp changes of its inputs, where it was asked for
    reference_noise: float | None = None


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def rounding_floor(dtype: torch.dtype) -> float:
    """The RMS error, relative to the reference's RMS, that rounding alone can explain."""
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    return FLOOR_OUTPUT_ULPS * torch.finfo(dtype).eps + FLOOR_COMPUTE_EPS * torch.finfo(compute).eps


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


# Running totals of one output are kept on the reference's device as one row of
# ``compare_kernels``' columns, so that comparing a chunk never waits for the GPU: the host reads
# them once, in ``finish``. float64 holds counts and indices of up to 2**53 elements exactly.
# Chunks' partial rows wait in a list and are combined this many at a time (5 MiB of rows at
# most): one reduction per many chunks, and memory bounded whatever the output's size.
COMBINE_EVERY = 64


@dataclass
class _TensorState:
    name: str
    reference: torch.Tensor  # flat view of the reference
    shape: tuple[int, ...]
    atol: float
    rtol: float
    # The running totals (``compare_kernels.combine``), None until a chunk's rows are combined:
    # nothing is made on the device before the first chunk, where the caller holds it.
    row: torch.Tensor | None = None
    pending: list[torch.Tensor] = field(default_factory=list)  # chunks' rows not yet in ``row``
    received: int = 0
    # Floating outputs: the degenerate answers (name, constants fitted), and once every value
    # arrived, the reference's statistics (``degenerate_errors``) on its device.
    answers: list[tuple[str, int]] = field(default_factory=list)
    statistics: torch.Tensor | None = None


class OutputMatcher:
    """One input set's outputs compared as they arrive, against references the child never saw."""

    def __init__(
        self,
        task: Task,
        expected: list[Any],
        set_index: int,
        statistics: dict[int, torch.Tensor] | None = None,
        rerun: Callable[[], list[Any]] | None = None,
    ) -> None:
        """``statistics``: a dict shared by matchers of the same ``expected``, so that several
        answers compared with one reference (benchmarks) compute its statistics once.
        ``rerun``: the reference's outputs on the same inputs moved by one ulp
        (``rerolled_reference``), asked for only when the information check alone would reject
        an output; without it the reference is taken as exact to its rounding floor."""
        self.task = task
        self.expected = expected
        self.where = f"input set {set_index}"
        self.result = Comparison(correct=True)
        self._tensors: dict[int, _TensorState] = {}
        self._statistics = {} if statistics is None else statistics
        self._rerun = rerun

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
                answers = degenerate_answers(shape) if ref.dtype in _FLOATS else []
                self._tensors[k] = _TensorState(
                    name, ref.reshape(-1), shape, atol, rtol, answers=answers
                )
        return streams

    def add_chunk(self, k: int, chunk: torch.Tensor) -> None:
        """The next elements of output ``k`` (1-D, its dtype, any device). ``chunk`` may be
        reused by the caller as soon as this returns: on a GPU what reads it is queued on the
        stream before whatever the caller queues next, and nothing here waits for the device.
        With the last chunk of an output come its combined totals and, for a floating output, the
        reference's statistics, so that they too are computed where the caller holds the device
        (the evaluator's lock on trusted GPU work)."""
        state = self._tensors.get(k)
        if state is None or chunk.numel() == 0:
            return
        start = state.received
        state.received += chunk.numel()
        ref = state.reference[start : state.received]
        state.pending.append(
            chunk_partials(chunk.to(ref.device), ref, start, state.atol, state.rtol)
        )
        complete = state.received == state.reference.numel()
        if complete or len(state.pending) >= COMBINE_EVERY:
            _combine_pending(state)
        if state.answers and complete:
            if k not in self._statistics:
                self._statistics[k] = degenerate_errors(state.reference.view(state.shape))
            state.statistics = self._statistics[k]

    def finish(self) -> Comparison:
        suspects: list[_Suspect] = []
        for k, state in self._tensors.items():
            # Reads only: the rows were combined with the last chunk, where the caller held the
            # device. An output that did not all arrive is reported as such, its figures those
            # of the chunks combined by then.
            found = totals(state.row)
            self.result.max_abs_err = max(self.result.max_abs_err, found["max_diff"])
            self.result.max_rel_err = max(self.result.max_rel_err, found["max_rel"])
            self.result.ref_scale = max(self.result.ref_scale, found["scale"])
            total = state.reference.numel()
            if state.received != total:
                self.result.problems.append(
                    f"{state.name}: {state.received} of {total} values arrived"
                )
                continue
            if found["nonfinite"]:
                self.result.problems.append(
                    f"{state.name}: {int(found['nonfinite'])} NaN/Inf values where the reference "
                    "is finite"
                )
                continue
            if found["mismatched"]:
                first = max(found["first"], 0)
                expected = float(state.reference[first].double())
                self.result.problems.append(
                    f"{state.name}: {int(found['mismatched'])}/{total} values outside "
                    f"atol={state.atol:g}, rtol={state.rtol:g}; first at index "
                    f"{_unravel(first, state.shape)}: got {found['got']:.6g}, expected "
                    f"{expected:.6g}; max abs error {found['max_diff']:.3g}"
                )
            if state.statistics is not None and (
                suspect := self._information(k, state, found["sse"])
            ):
                suspects.append(suspect)
        self._settle(suspects)
        self.result.correct = not self.result.problems
        return self.result

    def _information(self, k: int, state: _TensorState, sse: float) -> _Suspect | None:
        """The information check of one output whose values all arrived, all finite where
        the reference is: its figures go to ``self.result`` when it is the worst so far; an
        output over its bound comes back as a suspect."""
        assert state.statistics is not None
        count, sum_sq, *answer_sse = state.statistics.tolist()
        if count <= 0:
            return None
        floor = rounding_floor(state.reference.dtype) * math.sqrt(sum_sq / count)
        # An answer fitted with g constants is scored per remaining degree of freedom: the
        # spread it leaves, not its overfit to a short dimension (a mean over 2 rows is half).
        informative = [
            (math.sqrt(max(error, 0.0) / max(count - groups, 1.0)), answer)
            for error, (answer, groups) in zip(answer_sse, state.answers, strict=True)
        ]
        informative = [(error, answer) for error, answer in informative if error > floor]
        if not informative:  # every degenerate answer is the answer, at its precision
            return None
        best, best_answer = min(informative)
        rms = math.sqrt(sse / count)
        bound = max(INFORMATION_RATIO * best, floor)
        ratio = rms / best
        result = self.result
        if result.information_ratio is None or ratio > result.information_ratio:
            result.information_ratio, result.rms_err, result.information_bound = ratio, rms, bound
            result.degenerate_rms, result.degenerate_answer = best, best_answer
        if rms <= bound:
            return None
        # Named to the model: the simplest answer (zeros, a constant, the row mean, ...) that
        # scores about as well as the best, which is what it can act on.
        named, answer = next((e, a) for e, a in informative if e <= 1.1 * best)
        return _Suspect(k, state, count, rms, bound, named, answer)

    def _settle(self, suspects: list[_Suspect]) -> None:
        """Each suspect is incorrect, unless the reference is noise at the level of its error:
        moved, under one-ulp changes of its inputs, by over 1/NOISE_FACTOR of that error (an
        output that is zero but for rounding, such as the mean of a normalised tensor). The
        rerun is asked for only where it decides the verdict: no other problem was found."""
        outputs = None
        if suspects and self._rerun is not None and not self.result.problems:
            try:
                outputs = self._rerun()
            except torch.OutOfMemoryError:  # no room to tell: the bound alone decides
                outputs = None
        for suspect in suspects:
            state = suspect.state
            rerun = outputs[suspect.k] if outputs and len(outputs) > suspect.k else None
            if isinstance(rerun, torch.Tensor) and rerun.shape == state.shape:
                noise = rms_difference(state.reference, rerun.reshape(-1), suspect.count)
                self.result.reference_noise = max(self.result.reference_noise or 0.0, noise)
                if suspect.rms <= NOISE_FACTOR * noise:
                    continue
            self.result.uninformative += 1
            self.result.problems.append(suspect.message())


def _combine_pending(state: _TensorState) -> None:
    if state.pending:
        rows = state.pending if state.row is None else [state.row.view(1, -1), *state.pending]
        state.row = combine(torch.cat(rows))
        state.pending.clear()


@dataclass
class _Suspect:
    """An output whose RMS error is over its information bound."""

    k: int
    state: _TensorState
    count: float
    rms: float
    bound: float
    named: float  # the RMS error of the degenerate answer named to the model
    answer: str

    def message(self) -> str:
        ratio = self.rms / self.named
        return (
            f"{self.state.name}: the output carries {'no' if ratio >= 0.5 else 'too little'} "
            f"information beyond {self.answer}: its error, {self.rms:.3g} RMS, is {ratio:.2f}x "
            f"the {self.named:.3g} RMS error of answering {self.answer}, where a correct output "
            f"stays within {self.bound:.3g} RMS ({INFORMATION_RATIO:g}x the best such answer's, "
            f"or the rounding of {_dtype_name(self.state.reference.dtype)}). Compute every "
            "value from the inputs, at the output's precision: values smaller than atol are "
            "checked too."
        )


def _unravel(flat: int, shape: tuple[int, ...]) -> list[int]:
    index = []
    for dim in reversed(shape):
        index.append(flat % dim if dim else 0)
        flat = flat // dim if dim else 0
    return index[::-1]
