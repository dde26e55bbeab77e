"""A graph as a KernelBench-format task: ``Model``, ``get_inputs()``, ``get_init_inputs()``.

The module globals hold the GPU (KernelBench-like) sizes and ``KERNELRL["sizes"]["cpu"]`` the
interpreter-sized ones, or the other way round with ``size_profile="cpu"`` (then the globals
are small and a GPU run uses them as they are). Operand tensors of pointwise operators are
inputs named ``r0`` (row vector), ``c1`` (column), ``y2`` (full), numbered by position, so two
tasks differ in their text exactly where their graphs differ.
"""

from __future__ import annotations

from kernelrl.data.synth.graph import ALL_FAMILIES, CORE_FAMILY, OPERAND, Graph, Op, tolerances

_TORCH_DTYPE = {
    "float32": "torch.float32",
    "float16": "torch.float16",
    "bfloat16": "torch.bfloat16",
}
_CATEGORY = {
    "elementwise": "elementwise",
    "reduction": "reduction",
    "softmax": "softmax",
    "norm": "normalization",
    "matmul": "fused",
    "long_row": "",  # the category of its core's family (``category``)
    "dim_reduction": "reduction",
    "tiled_matmul": "matmul",
}
assert set(_CATEGORY) == set(ALL_FAMILIES)

_UNARY_TORCH = {
    "relu": "torch.relu(h)",
    "sigmoid": "torch.sigmoid(h)",
    "tanh": "torch.tanh(h)",
    "gelu": "F.gelu(h)",
    "silu": "F.silu(h)",
    "exp": "torch.exp(h)",
    "abs": "torch.abs(h)",
    "neg": "torch.neg(h)",
    "square": "h * h",
    "softplus": "F.softplus(h)",
}
_CORE_TORCH = {
    "sum": "torch.sum(h, dim=-1, keepdim=True)",
    "mean": "torch.mean(h, dim=-1, keepdim=True)",
    "amax": "torch.amax(h, dim=-1, keepdim=True)",
    "softmax": "torch.softmax(h, dim=-1)",
    "log_softmax": "torch.log_softmax(h, dim=-1)",
    "layer_norm": "F.layer_norm(h, (h.shape[-1],), eps=1e-5)",
    "rms_norm": "h * torch.rsqrt(torch.mean(h * h, dim=-1, keepdim=True) + 1e-6)",
    "l2_normalize": "F.normalize(h, p=2.0, dim=-1)",
    "linear": "F.linear(h, self.weight, self.bias)",
    "sum_dim": "torch.sum(h, dim=1, keepdim=True)",
    "mean_dim": "torch.mean(h, dim=1, keepdim=True)",
    "amax_dim": "torch.amax(h, dim=1, keepdim=True)",
    "amin_dim": "torch.amin(h, dim=1, keepdim=True)",
    "softmax_dim": "torch.softmax(h, dim=1)",
    "rms_norm_dim": "h * torch.rsqrt(torch.mean(h * h, dim=1, keepdim=True) + 1e-6)",
    "matmul": "torch.matmul(a, b)",
    "matmul_ta": "torch.matmul(a.T, b)",
    "matmul_tb": "torch.matmul(a, b.T)",
    "bmm": "torch.bmm(a, b)",
}
#: The two inputs of a tiled matrix product: their shapes as global names. ``b`` is scaled by
#: K ** -0.5 so that outputs stay of unit scale whatever K (an exp may follow).
_MATMUL_INPUTS = {
    "matmul": ("M, K", "K, N"),
    "matmul_ta": ("K, M", "K, N"),
    "matmul_tb": ("M, K", "N, K"),
    "bmm": ("batch_size, M, K", "batch_size, K, N"),
}


def category(graph: Graph) -> str:
    """The task's category (KernelBench's kind): a long row's is its core's family's."""
    if graph.family != "long_row":
        return _CATEGORY[graph.family]
    return "elementwise" if graph.core is None else _CATEGORY[CORE_FAMILY[graph.core.kind]]


def operand_name(op: Op, position: int) -> str | None:
    """The forward argument an operand operator reads, or None for other operators."""
    if op.kind not in OPERAND:
        return None
    return {"row": "r", "col": "c", "input": "y"}[op.kind.split("_")[1]] + str(position)


def torch_line(op: Op, position: int) -> str:
    """One statement ``h = ...`` of ``Model.forward``."""
    kind, p = op.kind, op.param
    if kind in _UNARY_TORCH:
        expr = _UNARY_TORCH[kind]
    elif kind == "add_scalar":
        expr = f"h + {p!r}"
    elif kind == "mul_scalar":
        expr = f"h * {p!r}"
    elif kind == "clamp":
        expr = f"torch.clamp(h, min={p[0]!r}, max={p[1]!r})"
    elif kind == "leaky_relu":
        expr = f"F.leaky_relu(h, negative_slope={p!r})"
    elif kind in OPERAND:
        expr = f"h {'+' if kind.startswith('add') else '*'} {operand_name(op, position)}"
    else:
        expr = _CORE_TORCH[kind]
    return f"h = {expr}"


def describe(graph: Graph) -> str:
    """One line for the docstring: the chain in words."""
    parts = []
    for op in graph.ops:
        if op.param is None:
            parts.append(op.kind)
        elif isinstance(op.param, tuple):
            parts.append(f"{op.kind}({', '.join(repr(v) for v in op.param)})")
        else:
            parts.append(f"{op.kind}({op.param!r})")
    return " -> ".join(parts)


def operand_shapes(graph: Graph) -> list[tuple[str, list[str]]]:
    """(argument name, its shape as global names or "1") for every operand, in order."""
    names = [name for name, _ in graph.sizes["cpu"].dims]
    if graph.core is not None and graph.core.kind == "linear":
        names = names[:-1] + ["out_features"]
    out: list[tuple[str, list[str]]] = []
    reduced = False
    for position, op in enumerate(graph.ops):
        if op is graph.core and op.kind in ("sum", "mean", "amax"):
            reduced = True
        name = operand_name(op, position)
        if name is None:
            continue
        if name[0] == "r":
            out.append((name, [names[-1]]))
        elif name[0] == "c" or reduced:
            out.append((name, names[:-1] + ["1"]))
        else:
            out.append((name, list(names)))
    return out


def render_task(
    graph: Graph, size_profile: str = "cuda", tolerance: tuple[float, float] | None = None
) -> str:
    """The task source. ``size_profile``: which sizes the globals hold (``cuda`` or ``cpu``);
    the other kind's sizes go to ``KERNELRL["sizes"]``. ``tolerance``: (atol, rtol) measured
    for it (``tolerance.measured_tolerances``), widening the graph's own where wider."""
    dtype = _TORCH_DTYPE[graph.dtype]
    linear = graph.core is not None and graph.core.kind == "linear"
    matmul = graph.family == "tiled_matmul"
    operands = operand_shapes(graph)
    args = "a, b" if matmul else ", ".join(["x"] + [name for name, _ in operands])
    lines = [
        f'"""Synthetic {graph.family} task ({graph.dtype}): {describe(graph)}."""',
        "",
        "import torch",
        "import torch.nn as nn",
        "import torch.nn.functional as F",
        "",
        "",
        "class Model(nn.Module):",
    ]
    if linear:
        lines += [
            "    def __init__(self, in_features: int, out_features: int):",
            "        super().__init__()",
            "        scale = in_features**-0.5",
            f"        self.weight = nn.Parameter(torch.randn(out_features, in_features, dtype={dtype}) * scale)",
            f"        self.bias = nn.Parameter(torch.randn(out_features, dtype={dtype}) * 0.1)",
        ]
    else:
        lines += ["    def __init__(self):", "        super().__init__()"]
    lines += ["", f"    def forward(self, {args}):", *([] if matmul else ["        h = x"])]
    lines += [f"        {torch_line(op, i)}" for i, op in enumerate(graph.ops)]
    lines += ["        return h", "", ""]
    values = graph.sizes[size_profile].values
    names = [n for n, _ in graph.sizes[size_profile].dims] + [
        n
        for n, _ in graph.sizes[size_profile].linear
        if n not in dict(graph.sizes[size_profile].dims)
    ]
    lines += [f"{name} = {values[name]}" for name in names]
    lines += ["", "", "def get_inputs():"]
    if matmul:
        first, second = _MATMUL_INPUTS[graph.core.kind]
        lines.append(f"    a = torch.randn({first}, dtype={dtype})")
        lines.append(f"    b = torch.randn({second}, dtype={dtype}) * K**-0.5")
    else:
        x_dims = ", ".join(n for n, _ in graph.sizes[size_profile].dims)
        lines.append(f"    x = torch.randn({x_dims}, dtype={dtype})")
    for name, shape in operands:
        lines.append(f"    {name} = torch.randn({', '.join(shape)}, dtype={dtype})")
    lines += [f"    return [{args}]", "", "", "def get_init_inputs():"]
    lines.append("    return [in_features, out_features]" if linear else "    return []")
    other = "cpu" if size_profile == "cuda" else "cuda"
    other_values = {n: graph.sizes[other].values[n] for n in names}
    meta: dict[str, object] = {
        "category": category(graph),
        "sizes": {other: other_values, size_profile: {}}
        if other == "cpu"
        else {"cpu": {}, "cuda": other_values},
    }
    tol = tolerances(graph)
    if tolerance is not None:
        tol = tolerance if tol is None else (max(tol[0], tolerance[0]), max(tol[1], tolerance[1]))
    if tol is not None:
        meta["atol"], meta["rtol"] = tol
    lines += ["", "", f"KERNELRL = {meta!r}", ""]
    return "\n".join(lines)
