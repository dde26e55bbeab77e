"""A half-precision task's tolerance, measured: how far eager PyTorch's own answer lies from the
same computation without its intermediate roundings.

Eager PyTorch rounds every operator's output to the task's dtype; a fused kernel keeps the
chain in fp32 registers and rounds once. Both are correct, and they differ by the rounding of
every intermediate, which a reduction adds up over its row: the dtype's default tolerance does
not grow with the row, so a correct fused kernel can fail it (docs/decisions.md). The
difference is measured at the GPU sizes' row length, on a few rows (``sample_sizes``:
milliseconds on the CPU), and the tolerance allows ``SAFETY`` times the largest part of it
that the dtype's ``rtol`` leaves uncovered: an output rounded to an adjacent value is within
``rtol``, a small sum of rounded terms is not. A task the default already covers keeps it.
This is trusted code running our own generated sources (``check``'s reasoning).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from kernelrl.data.synth.check import task_namespace
from kernelrl.data.synth.graph import Graph
from kernelrl.env.task import DEFAULT_TOLERANCES, init_args

#: How many times the largest difference seen the tolerance allows: the sample holds a few
#: hundred outputs, a GPU-sized task millions, and its tail is wider.
SAFETY = 3.0
#: Most rows measured, and most input elements (rows x row length x output width) they may take.
ROWS = 256
ELEMENTS = 1 << 21


def sample_sizes(graph: Graph) -> dict[str, int]:
    """The GPU sizes with the row length (and a linear layer's widths) kept, other dimensions
    1, and as many rows as ``ROWS`` and ``ELEMENTS`` allow."""
    shape = graph.sizes["cuda"]
    names = [name for name, _ in shape.dims]
    linear = dict(shape.linear)
    row_length = dict(shape.dims)[names[-1]]
    per_row = row_length * linear.get("out_features", 1)
    sizes = {name: 1 for name in names[:-1]}
    sizes[names[0]] = max(1, min(ROWS, ELEMENTS // per_row))
    return {**linear, **sizes, names[-1]: row_length}


def rounding_excess(graph: Graph, source: str, rtol: float) -> float:
    """The largest part of |eager in the task's dtype - the same chain in fp32, its output
    rounded to the dtype once (as a fused kernel stores it)| that ``rtol`` does not cover, at
    the GPU row length."""
    namespace = task_namespace(source, sample_sizes(graph))
    torch.manual_seed(0)
    args, kwargs = init_args(namespace["get_init_inputs"]())
    model = namespace["Model"](*args, **kwargs)
    inputs: list[Any] = namespace["get_inputs"]()
    with torch.no_grad():
        eager = model(*inputs)
        fused = model.float()(*[t.float() for t in inputs]).to(eager.dtype)
    eager, fused = eager.float(), fused.float()
    return float(((eager - fused).abs() - rtol * eager.abs()).max())


def measured_tolerances(graph: Graph, source: str) -> tuple[float, float] | None:
    """(atol, rtol) wider than the dtype's defaults where eager's own rounding needs it, else
    None. float32 tasks are left to the defaults: their chains round at fp32 either way."""
    if graph.dtype == "float32":
        return None
    atol, rtol = DEFAULT_TOLERANCES[graph.dtype]
    needed = SAFETY * rounding_excess(graph, source, rtol)
    if not math.isfinite(needed) or needed <= atol:
        return None
    scale = 10 ** (1 - math.floor(math.log10(needed)))  # two significant digits, rounded up
    return (math.ceil(needed * scale) / scale, rtol)
