"""A half-precision task's tolerance, measured: how far eager PyTorch's own answer lies from the
same computation without its intermediate roundings.

Eager PyTorch rounds every operator's output to the task's dtype; a fused kernel keeps the
chain in fp32 registers and rounds once. Both are correct, and they differ by the rounding of
every intermediate, which a row reduction adds up over the row: a float16 sum of 8,192 products
differs by about 0.05 where the dtype's default tolerance allows 0.01, so a correct fused kernel
failed on every answer. The difference grows with the row length, so it is measured at the GPU
sizes' row length (on ``ROWS`` rows, the other dimensions 1: milliseconds on the CPU), and
the tolerance allows ``SAFETY`` times the largest part of it the dtype's ``rtol`` leaves
uncovered: an output rounded to an adjacent value is within ``rtol``, a small sum of rounded
terms is not. A task whose measured difference the dtype's default already covers keeps the default.
This is trusted code running our own generated sources (``check``'s reasoning).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from kernelrl.data.synth.check import _DTYPES, _module
from kernelrl.data.synth.graph import Graph
from kernelrl.env.task import DEFAULT_TOLERANCES, init_args

#: How many times the largest difference seen the tolerance allows: the sample holds ``ROWS``
#: rows, a GPU-sized task millions, and its tail is wider.
SAFETY = 3.0
#: Rows the difference is measured on.
ROWS = 256


def _sizes(graph: Graph) -> dict[str, int]:
    """The GPU sizes with the row length kept, the first dimension ``ROWS`` and others 1."""
    shape = graph.sizes["cuda"]
    names = [name for name, _ in shape.dims]
    sizes = {name: 1 for name in names[1:-1]}
    sizes[names[0]] = ROWS
    sizes[names[-1]] = dict(shape.dims)[names[-1]]
    return {**dict(shape.linear), **sizes}


def rounding_excess(graph: Graph, source: str, rtol: float) -> float:
    """The largest part of |eager in the task's dtype - the same chain in fp32, its output
    rounded to the dtype once (as a fused kernel stores it)| that ``rtol`` does not cover, at
    the GPU row length."""
    namespace = _module(source, _sizes(graph))
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
    if _DTYPES[graph.dtype] == torch.float32:
        return None
    atol, rtol = DEFAULT_TOLERANCES[graph.dtype]
    needed = SAFETY * rounding_excess(graph, source, rtol)
    if not math.isfinite(needed) or needed <= atol:
        return None
    scale = 10 ** (1 - math.floor(math.log10(needed)))  # two significant digits, rounded up
    return (math.ceil(needed * scale) / scale, rtol)
