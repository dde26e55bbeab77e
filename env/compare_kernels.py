"""The comparison's arithmetic in one pass over the bytes, for outputs on a GPU.

Comparing a chunk of an output (``compare.OutputMatcher``) and scoring the reference's
degenerate answers (``information.degenerate_errors``) are float64 arithmetic over every
element. As PyTorch ops each step writes a float64 tensor the next one reads: about twenty
passes of 8-byte values per compared element, and six more passes per degenerate answer. At
KernelBench's published sizes that was over half a second of trusted GPU work per 6.4 GB
output, taken under the worker's GPU lock that every other evaluation's measurement and
comparison waits for. These kernels read each element once, compute in float64 in registers
and write a few partial sums per program. A chunk's partial rows are not reduced on their own:
at 32-MiB slots a 6.4 GB output is some two hundred chunks, and a dozen small PyTorch ops per
chunk cost the host more, under that same lock, than the kernel costs the GPU. The rows of many
chunks are combined at once (``combine``).

The arithmetic, and where NaN and infinity go, is the PyTorch version's (``torch_chunk_partials``
and ``torch_group_sums``, which still run on a CPU and for dtypes Triton cannot load);
tests/env/test_compare_kernels.py checks the two agree, under Triton's interpreter, on values
chosen to reach every branch. These kernels are the trusted side's own code, compiled into the
worker's Triton cache, which no sandbox can see (``sandbox.isolation_view``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import triton
import triton.language as tl

# The columns of a chunk's partial rows: one row per program of the chunk kernel, one row from
# the PyTorch path, and one row for an output's running totals (``combine``). The first five
# combine by sums, the next three by maxima (which leave NaN out: it is counted in the sums),
# and FIRST, the first mismatch's index in the whole output (inf when there is none), by a
# minimum that GOT, the answer's value there, follows.
MISMATCHED, NONFINITE, DIFF_NANS, REL_NANS, SSE = range(5)
MAX_DIFF, MAX_REL, SCALE = range(5, 8)
FIRST, GOT = 8, 9
COLUMNS = 10
_CHUNK_BLOCK = 1024
_CHUNK_PROGRAMS = 1024  # enough to fill any current GPU; each loops over its share
_GROUP_TILE = 2048  # elements per program step of the group kernel
_GROUP_PROGRAMS = 2048
# What Triton loads as a number: every output dtype a solution may return (compare.DTYPES)
# but the complex ones, which take the PyTorch path.
TRITON_DTYPES = (
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
)


def fused(*tensors: torch.Tensor) -> bool:
    """Whether these tensors take the kernels: on a GPU, in dtypes Triton loads, not empty
    (the PyTorch path's loops already do nothing there)."""
    return all(t.is_cuda and t.dtype in TRITON_DTYPES and t.numel() for t in tensors)


@triton.jit
def _chunk_kernel(
    out_ptr,
    ref_ptr,
    n,
    offset,
    atol,
    rtol,
    partial_ptr,
    BLOCK: tl.constexpr,
    COLUMNS: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)  # offsets past 2**31 (a 6.4 GB output's are)
    step = tl.num_programs(0) * BLOCK
    lanes = tl.arange(0, BLOCK)
    zero = tl.zeros([BLOCK], dtype=tl.float64)
    mismatched = zero
    nonfinite = zero
    max_diff = zero
    diff_nans = zero
    max_rel = zero
    rel_nans = zero
    scale = zero
    sse = zero
    got = zero
    # Each lane's first mismatch: a lane's positions only grow from one step to the next.
    first = tl.full([BLOCK], n, dtype=tl.int64)
    for start in range(pid * BLOCK, n, step):
        offsets = start + lanes
        inside = offsets < n
        ref = tl.load(ref_ptr + offsets, mask=inside, other=0).to(tl.float64)
        out = tl.load(out_ptr + offsets, mask=inside, other=0).to(tl.float64)
        finite_ref = (ref - ref) == 0  # false for NaN and for either infinity
        finite_out = (out - out) == 0
        diff = tl.abs(out - ref)
        diff = tl.where(finite_ref, diff, tl.where(out == ref, 0.0, float("inf")))
        bad = inside & (diff > atol + rtol * tl.abs(ref))
        mismatched += bad.to(tl.float64)
        nonfinite += (inside & finite_ref & ~finite_out).to(tl.float64)
        diff_nan = inside & (diff != diff)
        diff_nans += diff_nan.to(tl.float64)
        max_diff = tl.maximum(max_diff, tl.where(inside & ~diff_nan, diff, 0.0))
        magnitude = tl.abs(ref)
        # NaN stays NaN, as clamp_min. Triton's float64 division is not correctly rounded (a
        # relative 1e-7 on an H200): the figure is reported, never part of the verdict.
        rel = diff / tl.where(magnitude < atol, atol, magnitude)
        rel_nan = inside & (rel != rel)
        rel_nans += rel_nan.to(tl.float64)
        max_rel = tl.maximum(max_rel, tl.where(inside & ~rel_nan, rel, 0.0))
        scale = tl.maximum(scale, tl.where(inside & finite_ref, magnitude, 0.0))
        lane_first = bad & (first == n)
        got = tl.where(lane_first, out, got)
        first = tl.where(lane_first, offsets, first)
        kept = tl.where(inside & finite_ref, diff, 0.0)
        sse += kept * kept
    program_first = tl.min(first, 0)
    row = partial_ptr + pid * COLUMNS  # in the order of the MISMATCHED... names
    tl.store(row + 0, tl.sum(mismatched, 0))
    tl.store(row + 1, tl.sum(nonfinite, 0))
    tl.store(row + 2, tl.sum(diff_nans, 0))
    tl.store(row + 3, tl.sum(rel_nans, 0))
    tl.store(row + 4, tl.sum(sse, 0))
    tl.store(row + 5, tl.max(max_diff, 0))
    tl.store(row + 6, tl.max(max_rel, 0))
    tl.store(row + 7, tl.max(scale, 0))
    found = program_first < n
    tl.store(row + 8, tl.where(found, (program_first + offset).to(tl.float64), float("inf")))
    # One lane holds the program's first mismatch (none: every lane's got is still 0).
    tl.store(row + 9, tl.sum(tl.where(first == program_first, got, 0.0), 0))


def chunk_partials(
    out: torch.Tensor, ref: torch.Tensor, offset: int, atol: float, rtol: float
) -> torch.Tensor:
    """The partial rows (``COLUMNS`` wide) of one chunk compared with the same slice of the
    reference, ``offset`` elements into the output: on the device and without waiting for it.
    Rows of many chunks combine into an output's totals (``combine``), so a chunk costs one
    kernel launch and no reduction of its own."""
    if not fused(out, ref):
        return torch_chunk_partials(out, ref, offset, atol, rtol)
    return triton_chunk_partials(out, ref, offset, atol, rtol)


def triton_chunk_partials(
    out: torch.Tensor, ref: torch.Tensor, offset: int, atol: float, rtol: float
) -> torch.Tensor:
    """``chunk_partials`` by the kernel, wherever Triton runs (a GPU, or its interpreter)."""
    n = ref.numel()
    programs = max(1, min(_CHUNK_PROGRAMS, triton.cdiv(n, _CHUNK_BLOCK)))
    partial = torch.empty(programs, COLUMNS, dtype=torch.float64, device=ref.device)
    _chunk_kernel[(programs,)](
        out, ref, n, offset, float(atol), float(rtol), partial, _CHUNK_BLOCK, COLUMNS
    )
    return partial


def torch_chunk_partials(
    out: torch.Tensor, ref: torch.Tensor, offset: int, atol: float, rtol: float
) -> torch.Tensor:
    """``chunk_partials`` in PyTorch ops, as one row (a CPU, complex outputs, and the kernel's
    yardstick)."""
    ref = ref.double()
    out = out.to(ref.device).double()
    finite_ref = torch.isfinite(ref)
    nonfinite = (finite_ref & ~torch.isfinite(out)).sum()
    diff = (out - ref).abs()
    diff = torch.where(finite_ref, diff, torch.where(out == ref, 0.0, float("inf")))
    mismatched = diff > atol + rtol * ref.abs()
    rel = diff / ref.abs().clamp_min(atol)
    at = mismatched.to(torch.uint8).argmax()  # the first mismatch (argmax takes the first)
    found = mismatched.any()
    return torch.stack(
        [
            mismatched.sum().double(),
            nonfinite.double(),
            diff.isnan().sum().double(),
            rel.isnan().sum().double(),
            torch.where(finite_ref, diff, 0.0).square().sum(),
            torch.where(diff.isnan(), 0.0, diff).max(),
            torch.where(rel.isnan(), 0.0, rel).max(),
            torch.where(finite_ref, ref.abs(), 0.0).max(),
            torch.where(found, (at + offset).double(), math.inf),
            torch.where(found, out[at], 0.0),
        ]
    ).view(1, COLUMNS)


def combine(rows: torch.Tensor) -> torch.Tensor:
    """Partial rows (any number, in any order) as one row of the same columns: sums, maxima,
    and the first mismatch with the value found there. On the device, without waiting."""
    at = rows[:, FIRST].argmin()
    return torch.cat([rows[:, :MAX_DIFF].sum(0), rows[:, MAX_DIFF:FIRST].amax(0), rows[at, FIRST:]])


def totals(row: torch.Tensor | None) -> dict[str, float]:
    """A combined row read on the host (None: nothing compared), NaN put back into the maxima
    it was counted beside, and ``first`` -1 where nothing mismatched."""
    values = [0.0] * FIRST + [math.inf, 0.0] if row is None else row.tolist()
    first = values[FIRST]
    return {
        "mismatched": values[MISMATCHED],
        "nonfinite": values[NONFINITE],
        "max_diff": math.nan if values[DIFF_NANS] else values[MAX_DIFF],
        "max_rel": math.nan if values[REL_NANS] else values[MAX_REL],
        "scale": values[SCALE],
        "first": int(first) if math.isfinite(first) else -1,
        "got": values[GOT],
        "sse": values[SSE],
    }


@triton.jit
def _group_kernel(
    x_ptr,
    mean_ptr,
    partial_ptr,
    length,
    after,
    per_split,
    stride_b,
    stride_l,
    stride_a,
    groups,
    a_blocks,
    CENTRED: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_A: tl.constexpr,
):
    # One axis for the groups (CUDA allows 2**31 - 1 programs there, 65535 on the others).
    b = tl.program_id(0) // a_blocks
    a = (tl.program_id(0) % a_blocks) * BLOCK_A + tl.arange(0, BLOCK_A)
    split = tl.program_id(1)
    a_inside = a < after
    group = b * after + a
    mean = tl.zeros([BLOCK_A], dtype=tl.float64)
    if CENTRED:
        mean = tl.load(mean_ptr + group, mask=a_inside, other=0.0)
    count = tl.zeros([BLOCK_L, BLOCK_A], dtype=tl.float64)
    total = tl.zeros([BLOCK_L, BLOCK_A], dtype=tl.float64)
    squares = tl.zeros([BLOCK_L, BLOCK_A], dtype=tl.float64)
    lanes = tl.arange(0, BLOCK_L)
    first = split * per_split
    last = tl.minimum(first + per_split, length)
    base = x_ptr + b.to(tl.int64) * stride_b + a[None, :].to(tl.int64) * stride_a
    for start in range(first, last, BLOCK_L):
        rows = start + lanes
        inside = (rows < last)[:, None] & a_inside[None, :]
        x = tl.load(base + rows[:, None].to(tl.int64) * stride_l, mask=inside, other=0)
        x = x.to(tl.float64)
        keep = inside & ((x - x) == 0)
        value = tl.where(keep, x - mean[None, :], 0.0)
        count += keep.to(tl.float64)
        total += value
        squares += value * value
    out = partial_ptr + split * 3 * groups + group
    tl.store(out, tl.sum(count, 0), mask=a_inside)
    tl.store(out + groups, tl.sum(total, 0), mask=a_inside)
    tl.store(out + 2 * groups, tl.sum(squares, 0), mask=a_inside)


def group_sums(
    view: torch.Tensor, mean: torch.Tensor | None = None, *, step_elements: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per group of a (before, length, after) view (one group per before x after position),
    over its finite values: count, sum and sum of squares, each (before, 1, after) in float64;
    with ``mean`` ((before, 1, after)) the sum and squares are of each value minus its group's
    mean. As ``torch_group_sums`` (``step_elements``: its float64 slices)."""
    if not fused(view):
        return torch_group_sums(view, mean, step_elements=step_elements)
    return triton_group_sums(view, mean)


def triton_group_sums(
    view: torch.Tensor, mean: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``group_sums`` by the kernel, wherever Triton runs (a GPU, or its interpreter)."""
    before, length, after = view.shape
    groups = before * after
    block_a = min(triton.next_power_of_2(max(after, 1)), 64)
    block_l = max(_GROUP_TILE // block_a, 1)
    a_blocks = triton.cdiv(after, block_a)
    programs = before * a_blocks
    splits = max(1, min(triton.cdiv(_GROUP_PROGRAMS, programs), triton.cdiv(length, block_l)))
    per_split = triton.cdiv(triton.cdiv(length, splits), block_l) * block_l
    splits = triton.cdiv(length, per_split)
    partial = torch.empty(splits, 3, groups, dtype=torch.float64, device=view.device)
    centre = mean.reshape(groups).contiguous() if mean is not None else partial
    grid = (programs, splits)
    _group_kernel[grid](
        view,
        centre,
        partial,
        length,
        after,
        per_split,
        view.stride(0),
        view.stride(1),
        view.stride(2),
        groups,
        a_blocks,
        CENTRED=mean is not None,
        BLOCK_L=block_l,
        BLOCK_A=block_a,
    )
    sums = partial.sum(0).view(3, before, 1, after)
    return sums[0], sums[1], sums[2]


def torch_group_sums(
    view: torch.Tensor, mean: torch.Tensor | None = None, *, step_elements: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``group_sums`` in PyTorch ops (a CPU, and the kernel's yardstick)."""
    groups = (view.shape[0], 1, view.shape[2])
    count, total, squares = (
        torch.zeros(groups, dtype=torch.float64, device=view.device) for _ in range(3)
    )
    for part in float64_slices(view, step_elements):
        finite = torch.isfinite(part)
        values = torch.where(finite, part if mean is None else part - mean, 0.0)
        count = count + finite.sum(1, keepdim=True)
        total = total + values.sum(1, keepdim=True)
        squares = squares + values.square().sum(1, keepdim=True)
    return count, total, squares


def float64_slices(view: torch.Tensor, step_elements: int) -> Iterator[torch.Tensor]:
    """Slices of a (before, length, after) view along its middle dimension in float64, each at
    most ``step_elements`` values (one when a single position along it is already that
    large): the PyTorch path's memory, however large the view."""
    step = max(1, step_elements // max(1, view.shape[0] * view.shape[2]))
    for start in range(0, view.shape[1], step):
        yield view[:, start : start + step].double()
