"""In-process checks of generated task sources, which are trusted: this package wrote them.

Why in-process: a sandboxed child costs seconds on a small CPU, so ten thousand of them do not
fit in minutes; the generated code is ours (``render``), not a corpus record, so running it
here exposes nothing. What runs here, per task:

- at the GPU sizes, on torch's ``meta`` device (no memory, no compute): ``Model`` is built and
  called; the output's shape and dtype must be those the graph infers. This catches a
  broadcast or a linear layer whose sizes do not fit, at the sizes nobody runs on this box;
- at the CPU sizes, on real tensors, twice with different inputs: the output must be finite,
  of the inferred shape and dtype, and differ between the two input draws (a constant output is
  no task). This is what the environment's own reference validation rejects, found cheaply.

Values at the GPU sizes are never computed here: hazards that grow with the row length (a
sum's magnitude, and what an ``exp`` makes of it) are excluded when graphs are drawn (``graph``).

The environment's sandboxed validation (``kernelrl.data.curate.validate``) still runs on a
seeded sample and on every task that gets a reference solution (``pipeline``): that is the
check that the task works in the environment, not merely in this process.
"""

from __future__ import annotations

from typing import Any

import torch

from kernelrl.data.synth.graph import Graph
from kernelrl.env.task import init_args

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def task_namespace(source: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """The task module's globals, with size globals replaced by ``overrides``."""
    namespace: dict[str, Any] = {"__name__": "synthetic_task"}
    exec(compile(source, "<synthetic task>", "exec"), namespace)  # noqa: S102 - our own code
    namespace.update(overrides)
    return namespace


def _call(namespace: dict[str, Any]) -> torch.Tensor:
    args, kwargs = init_args(namespace["get_init_inputs"]())
    model = namespace["Model"](*args, **kwargs)
    with torch.no_grad():
        return model(*namespace["get_inputs"]())


def check_task(graph: Graph, source: str, size_profile: str) -> str | None:
    """None when the task is sound, else a one-line reason (see the module docstring)."""
    dtype = _DTYPES[graph.dtype]
    other = "cpu" if size_profile == "cuda" else "cuda"
    try:
        cuda = task_namespace(source, graph.sizes["cuda"].values if other == "cuda" else {})
        with torch.device("meta"):
            out = _call(cuda)
        if tuple(out.shape) != graph.output_shape("cuda") or out.dtype != dtype:
            return f"meta output {tuple(out.shape)} {out.dtype}, expected {graph.output_shape('cuda')} {dtype}"
        cpu = task_namespace(source, graph.sizes["cpu"].values if other == "cpu" else {})
        outputs = []
        for seed in (1, 2):
            torch.manual_seed(seed)
            outputs.append(_call(cpu))
    except Exception as exc:  # a task that does not run is reported, not raised
        return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    first, second = outputs
    if tuple(first.shape) != graph.output_shape("cpu") or first.dtype != dtype:
        return f"output {tuple(first.shape)} {first.dtype}, expected {graph.output_shape('cpu')} {dtype}"
    if not (torch.isfinite(first).all() and torch.isfinite(second).all()):
        return "non-finite output"
    if torch.equal(first, second):
        return "output does not depend on the inputs"
    return None
