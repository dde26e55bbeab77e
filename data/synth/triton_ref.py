"""A graph as a Triton reference solution: one fused kernel per task.

Two kernel shapes cover every family. Row tasks (elementwise chains, row reductions, softmax,
norms) run one program per row of the last dimension with the whole row in one block: the
prologue is applied to the loaded row, the core reduces or normalises it in registers, the
epilogue is applied before the single store. A linear core is a tiled ``tl.dot`` with the bias
and the epilogue applied to the fp32 accumulator. Arithmetic is fp32 whatever the task's dtype
(loads are upcast, the store casts back), which is what a careful kernel author writes.

These sources are only *candidates*: ``references`` keeps one only after the environment
judged it ``correct`` on the task.
"""

from __future__ import annotations

from kernelrl.data.synth.graph import OPERAND, REDUCING, Graph, Op
from kernelrl.data.synth.render import operand_shapes

_UNARY_TRITON = {
    "relu": "tl.maximum(h, 0.0)",
    "sigmoid": "tl.sigmoid(h)",
    "tanh": "2.0 * tl.sigmoid(2.0 * h) - 1.0",
    "gelu": "0.5 * h * (1.0 + tl.math.erf(h * 0.7071067811865476))",
    "silu": "h * tl.sigmoid(h)",
    "exp": "tl.exp(h)",
    "abs": "tl.abs(h)",
    "neg": "-h",
    "square": "h * h",
    # torch's softplus returns x itself above its threshold of 20
    "softplus": "tl.where(h > 20.0, h, tl.log(1.0 + tl.exp(tl.minimum(h, 20.0))))",
}


def _pointwise(op: Op, operand: str | None) -> str:
    kind, p = op.kind, op.param
    if kind in _UNARY_TRITON:
        return _UNARY_TRITON[kind]
    if kind == "add_scalar":
        return f"h + {float(p)!r}"
    if kind == "mul_scalar":
        return f"h * {float(p)!r}"
    if kind == "clamp":
        return f"tl.minimum(tl.maximum(h, {float(p[0])!r}), {float(p[1])!r})"
    if kind == "leaky_relu":
        return f"tl.where(h > 0.0, h, h * {float(p)!r})"
    if kind in OPERAND:
        return f"h {'+' if kind.startswith('add') else '*'} {operand}"
    raise ValueError(f"not a pointwise operator: {kind}")


def pointwise_lines(ops: list[Op] | tuple[Op, ...]) -> list[str]:
    """Statements applying unary and scalar pointwise operators (no operands) to ``h``."""
    return [f"h = {_pointwise(op, None)}" for op in ops]


def _row_core(kind: str) -> list[str]:
    """Statements turning the masked row ``h`` into the core's result (a scalar for reductions)."""
    if kind == "sum":
        return ["h = tl.sum(tl.where(mask, h, 0.0), axis=0)"]
    if kind == "mean":
        return ["h = tl.sum(tl.where(mask, h, 0.0), axis=0) / n_cols"]
    if kind == "amax":
        return ['h = tl.max(tl.where(mask, h, float("-inf")), axis=0)']
    if kind in ("softmax", "log_softmax"):
        lines = [
            'z = tl.where(mask, h, float("-inf"))',
            "z = z - tl.max(z, axis=0)",
            "e = tl.where(mask, tl.exp(z), 0.0)",
        ]
        if kind == "softmax":
            return lines + ["h = e / tl.sum(e, axis=0)"]
        return lines + ["h = tl.where(mask, z - tl.log(tl.sum(e, axis=0)), 0.0)"]
    if kind == "layer_norm":
        return [
            "mu = tl.sum(tl.where(mask, h, 0.0), axis=0) / n_cols",
            "d = tl.where(mask, h - mu, 0.0)",
            "h = d / tl.sqrt(tl.sum(d * d, axis=0) / n_cols + 1e-5)",
        ]
    if kind == "rms_norm":
        return ["h = h / tl.sqrt(tl.sum(tl.where(mask, h * h, 0.0), axis=0) / n_cols + 1e-6)"]
    if kind == "l2_normalize":
        return ["h = h / tl.maximum(tl.sqrt(tl.sum(tl.where(mask, h * h, 0.0), axis=0)), 1e-12)"]
    raise ValueError(f"not a row core: {kind}")


def _operand_load(name: str, where: str, reduced: bool) -> str:
    """Load of operand ``name`` (pointer ``{name}_ptr``) in a row kernel (``where``: row) or a
    tile (``where``: tile), upcast to fp32."""
    kind = name[0]
    if where == "row":
        if kind == "r":
            index, mask = "cols", "mask"
        elif kind == "c" or reduced:
            index, mask = "row", None
        else:
            index, mask = "offs", "mask"
    else:
        if kind == "r":
            index, mask = "cols[None, :]", "cols[None, :] < N"
        elif kind == "c":
            index, mask = "rows[:, None]", "rows[:, None] < M"
        else:
            index, mask = "rows[:, None].to(tl.int64) * N + cols[None, :]", "tile_mask"
    masked = f", mask={mask}, other=0.0" if mask else ""
    return f"{name} = tl.load({name}_ptr + {index}{masked}).to(tl.float32)"


def _chain(
    ops: list[tuple[int, Op]], names: dict[int, str], where: str, reduced: bool
) -> list[str]:
    lines = []
    for position, op in ops:
        name = names.get(position)
        if name is not None:
            lines.append(_operand_load(name, where, reduced))
        lines.append(f"h = {_pointwise(op, name)}")
    return lines


def _indent(lines: list[str], depth: int = 1) -> list[str]:
    return ["    " * depth + line for line in lines]


def render_solution(graph: Graph) -> str:
    """The Triton solution source: a kernel, its launcher, and ``ModelNew``."""
    operands = [name for name, _ in operand_shapes(graph)]
    names: dict[int, str] = {}
    for position, op in enumerate(graph.ops):
        if op.kind in OPERAND:
            names[position] = next(n for n in operands if n[1:] == str(position))
    linear = graph.core is not None and graph.core.kind == "linear"
    return (
        _linear_solution(graph, operands, names)
        if linear
        else _row_solution(graph, operands, names)
    )


def _header() -> list[str]:
    return [
        "import torch",
        "import torch.nn as nn",
        "import triton",
        "import triton.language as tl",
        "",
        "",
    ]


def _row_solution(graph: Graph, operands: list[str], names: dict[int, str]) -> str:
    ops = list(enumerate(graph.ops))
    core_at = next((i for i, op in ops if op is graph.core), None)
    prologue = ops if core_at is None else ops[:core_at]
    epilogue = [] if core_at is None else ops[core_at + 1 :]
    reduced = graph.core is not None and graph.core.kind in REDUCING
    ptrs = "".join(f"{n}_ptr, " for n in operands)
    body = [
        "row = tl.program_id(0)",
        "cols = tl.arange(0, BLOCK)",
        "mask = cols < n_cols",
        "offs = row.to(tl.int64) * n_cols + cols",
        "h = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)",
    ]
    body += _chain(prologue, names, "row", False)
    if graph.core is not None:
        body += _row_core(graph.core.kind)
    body += _chain(epilogue, names, "row", reduced)
    if reduced:
        body.append("tl.store(out_ptr + row, h.to(out_ptr.dtype.element_ty))")
    else:
        body.append("tl.store(out_ptr + offs, h.to(out_ptr.dtype.element_ty), mask=mask)")
    args = ", ".join(["x"] + operands)
    flat = "".join(f"{n}.contiguous(), " for n in operands)
    out_shape = "(*x.shape[:-1], 1)" if reduced else "x.shape"
    lines = _header() + [
        "@triton.jit",
        f"def fused_rows_kernel(x_ptr, {ptrs}out_ptr, n_cols, BLOCK: tl.constexpr):",
        *_indent(body),
        "",
        "",
        f"def fused_rows({args}):",
        "    x = x.contiguous()",
        "    n_cols = x.shape[-1]",
        "    n_rows = x.numel() // n_cols",
        f"    out = torch.empty({out_shape}, dtype=x.dtype, device=x.device)",
        "    block = triton.next_power_of_2(n_cols)",
        f"    fused_rows_kernel[(n_rows,)](x, {flat}out, n_cols, BLOCK=block)",
        "    return out",
        "",
        "",
        "class ModelNew(nn.Module):",
        "    def __init__(self):",
        "        super().__init__()",
        "",
        f"    def forward(self, {args}):",
        f"        return fused_rows({args})",
        "",
    ]
    return "\n".join(lines)


def _linear_solution(graph: Graph, operands: list[str], names: dict[int, str]) -> str:
    dtype = {"float32": "torch.float32", "float16": "torch.float16", "bfloat16": "torch.bfloat16"}[
        graph.dtype
    ]
    epilogue = [(i, op) for i, op in enumerate(graph.ops) if op is not graph.core]
    ptrs = "".join(f"{n}_ptr, " for n in operands)
    body = [
        "pid_m = tl.program_id(0)",
        "pid_n = tl.program_id(1)",
        "rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        "cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
        "ks = tl.arange(0, BLOCK_K)",
        "acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)",
        "for k0 in range(0, K, BLOCK_K):",
        "    k = k0 + ks",
        "    a = tl.load(x_ptr + rows[:, None].to(tl.int64) * K + k[None, :], "
        "mask=(rows[:, None] < M) & (k[None, :] < K), other=0.0).to(tl.float32)",
        "    b = tl.load(w_ptr + cols[None, :].to(tl.int64) * K + k[:, None], "
        "mask=(k[:, None] < K) & (cols[None, :] < N), other=0.0).to(tl.float32)",
        '    acc = tl.dot(a, b, acc, input_precision="ieee")',
        "tile_mask = (rows[:, None] < M) & (cols[None, :] < N)",
        "bias = tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)",
        "h = acc + bias[None, :]",
    ]
    body += _chain(epilogue, names, "tile", False)
    body.append(
        "tl.store(out_ptr + rows[:, None].to(tl.int64) * N + cols[None, :], "
        "h.to(out_ptr.dtype.element_ty), mask=tile_mask)"
    )
    args = ", ".join(["x"] + operands)
    flat = "".join(f"{n}.contiguous(), " for n in operands)
    lines = _header() + [
        "@triton.jit",
        f"def fused_linear_kernel(x_ptr, w_ptr, bias_ptr, {ptrs}out_ptr, M, N, K,",
        "                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):",
        *_indent(body),
        "",
        "",
        f"def fused_linear(weight, bias, {args}):",
        "    x2 = x.contiguous().view(-1, x.shape[-1])",
        "    M, K = x2.shape",
        "    N = weight.shape[0]",
        "    out = torch.empty((M, N), dtype=x.dtype, device=x.device)",
        "    grid = (triton.cdiv(M, 32), triton.cdiv(N, 32))",
        f"    fused_linear_kernel[grid](x2, weight.contiguous(), bias, {flat}out, M, N, K,",
        "                              BLOCK_M=32, BLOCK_N=32, BLOCK_K=32)",
        "    return out.view(*x.shape[:-1], N)",
        "",
        "",
        "class ModelNew(nn.Module):",
        "    def __init__(self, in_features: int, out_features: int):",
        "        super().__init__()",
        "        scale = in_features**-0.5",
        f"        self.weight = nn.Parameter(torch.randn(out_features, in_features, dtype={dtype}) * scale)",
        f"        self.bias = nn.Parameter(torch.randn(out_features, dtype={dtype}) * 0.1)",
        "",
        f"    def forward(self, {args}):",
        f"        return fused_linear(self.weight, self.bias, {args})",
        "",
    ]
    return "\n".join(lines)


def explain(graph: Graph) -> str:
    """The short reasoning written before a reference solution in its SFT record."""
    pointwise = [op.kind for op in graph.ops if op is not graph.core]
    steps = ", ".join(pointwise) if pointwise else "nothing else"
    if graph.core is not None and graph.core.kind == "linear":
        return (
            "A linear layer followed by pointwise operators: one tiled tl.dot kernel. Each program "
            "owns a 32x32 output tile, accumulates x @ W^T in fp32 over K, then adds the bias and "
            f"applies {steps} to the accumulator before a single masked store, so the "
            "intermediate never goes to memory."
        )
    if graph.core is None:
        return (
            f"A chain of pointwise operators ({steps}): one kernel, one program per row, the "
            "row loaded once and upcast to fp32, every operator applied in registers, one "
            "store. Operands broadcast along rows or columns are loaded with the row's column "
            "or row index."
        )
    core = graph.core.kind
    return (
        f"Everything depends on one row only ({core} over the last dimension), so one program "
        "per row holds the whole row in a block (next power of two, masked), computes in fp32, "
        f"applies the pointwise operators around {core} in registers ({steps}) and stores once; "
        "masked lanes are neutralised before every reduction."
    )
