"""Triton reference solutions of the layout families (``graph.LAYOUT_FAMILIES``), and the one
entry point for every graph's reference (``solution_for``, ``explain_for``).

What the row template (``triton_ref``) cannot do, and these kernels do:

- **long rows**: a row longer than any block (KernelBench's 393,216-wide softmax). One program
  per row loops over it in blocks of ``LONG_BLOCK``, in as many passes as the core needs (a
  reduction: one; softmax: its maximum, its sum, then the outputs; layer norm: mean, variance,
  outputs), applying the prologue to every block it loads;
- **a core over dimension 1** of a ``(batch, dim1, dim2)`` tensor: each program owns
  ``DIM_BLOCK_N`` columns of one batch and loops over dimension 1 in tiles of ``DIM_BLOCK_M``
  rows, accumulating per column;
- **tiled matrix products** of two inputs, plain, with either operand transposed (its strides
  swapped, nothing copied) or batched (the grid's third axis).

Arithmetic is fp32, as in ``triton_ref``. These are candidates: ``references`` keeps one only
after the environment judged it correct.
"""

from __future__ import annotations

from kernelrl.data.synth.graph import DIM_REDUCING, REDUCING, Graph
from kernelrl.data.synth.triton_ref import (
    _header,
    _indent,
    explain,
    pointwise_lines,
    render_solution,
)

LONG_BLOCK = 1024
DIM_BLOCK_M, DIM_BLOCK_N = 16, 64
TILE = 32


def solution_for(graph: Graph) -> str:
    """Any graph's Triton reference solution source."""
    if graph.family == "long_row":
        return _long_row_solution(graph)
    if graph.family == "dim_reduction":
        return _dim_solution(graph)
    if graph.family == "tiled_matmul":
        return _matmul_solution(graph)
    return render_solution(graph)


def _split(graph: Graph) -> tuple[list[str], list[str]]:
    """(prologue, epilogue) statements: the pointwise operators before and after the core."""
    core_at = next((i for i, op in enumerate(graph.ops) if op is graph.core), len(graph.ops))
    return pointwise_lines(graph.ops[:core_at]), pointwise_lines(graph.ops[core_at + 1 :])


# ------------------------------------------------------------------------------ long rows
def _row_loop(body: list[str], prologue: list[str]) -> list[str]:
    """A pass over the row: each block loaded, upcast, the prologue applied, then ``body``."""
    load = [
        "cols = start + tl.arange(0, BLOCK)",
        "mask = cols < n_cols",
        "h = tl.load(x_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)",
    ]
    return ["for start in range(0, n_cols, BLOCK):", *_indent(load + prologue + body)]


def _long_row_passes(kind: str | None, prologue: list[str], epilogue: list[str]) -> list[str]:
    store = ["tl.store(out_ptr + base + cols, h.to(out_ptr.dtype.element_ty), mask=mask)"]
    zeros = "tl.zeros([BLOCK], dtype=tl.float32)"
    if kind is None:
        return _row_loop(epilogue + store, prologue)
    if kind in REDUCING:
        if kind == "amax":
            init = 'acc = tl.full([BLOCK], float("-inf"), tl.float32)'
            step = 'acc = tl.maximum(acc, tl.where(mask, h, float("-inf")))'
            final = "h = tl.max(acc, axis=0)"
        else:
            init, step = f"acc = {zeros}", "acc += tl.where(mask, h, 0.0)"
            final = "h = tl.sum(acc, axis=0)" + (" / n_cols" if kind == "mean" else "")
        out = ["tl.store(out_ptr + row, h.to(out_ptr.dtype.element_ty))"]
        return [init, *_row_loop([step], prologue), final, *epilogue, *out]
    if kind in ("softmax", "log_softmax"):
        write = "h = tl.exp(h - m) / total" if kind == "softmax" else "h = h - m - tl.log(total)"
        return [
            'mx = tl.full([BLOCK], float("-inf"), tl.float32)',
            *_row_loop(['mx = tl.maximum(mx, tl.where(mask, h, float("-inf")))'], prologue),
            "m = tl.max(mx, axis=0)",
            f"acc = {zeros}",
            *_row_loop(["acc += tl.where(mask, tl.exp(h - m), 0.0)"], prologue),
            "total = tl.sum(acc, axis=0)",
            *_row_loop([write, *epilogue, *store], prologue),
        ]
    if kind == "layer_norm":
        return [
            f"acc = {zeros}",
            *_row_loop(["acc += tl.where(mask, h, 0.0)"], prologue),
            "mu = tl.sum(acc, axis=0) / n_cols",
            f"acc = {zeros}",
            *_row_loop(["d = tl.where(mask, h - mu, 0.0)", "acc += d * d"], prologue),
            "rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n_cols + 1e-5)",
            *_row_loop(["h = (h - mu) * rstd", *epilogue, *store], prologue),
        ]
    if kind in ("rms_norm", "l2_normalize"):
        scale = (
            "scale = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n_cols + 1e-6)"
            if kind == "rms_norm"
            else "scale = 1.0 / tl.maximum(tl.sqrt(tl.sum(acc, axis=0)), 1e-12)"
        )
        return [
            f"acc = {zeros}",
            *_row_loop(["acc += tl.where(mask, h * h, 0.0)"], prologue),
            scale,
            *_row_loop(["h = h * scale", *epilogue, *store], prologue),
        ]
    raise ValueError(f"not a long-row core: {kind}")


def _long_row_solution(graph: Graph) -> str:
    prologue, epilogue = _split(graph)
    kind = graph.core.kind if graph.core is not None else None
    body = ["row = tl.program_id(0)", "base = row.to(tl.int64) * n_cols"]
    body += _long_row_passes(kind, prologue, epilogue)
    reduced = kind in REDUCING
    lines = _header() + [
        "@triton.jit",
        "def long_row_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):",
        *_indent(body),
        "",
        "",
        "def long_rows(x):",
        "    x = x.contiguous()",
        "    n_cols = x.shape[-1]",
        "    n_rows = x.numel() // n_cols",
        f"    out = torch.empty({'(*x.shape[:-1], 1)' if reduced else 'x.shape'}, "
        "dtype=x.dtype, device=x.device)",
        f"    long_row_kernel[(n_rows,)](x, out, n_cols, BLOCK={LONG_BLOCK})",
        "    return out",
        *_module("x", "long_rows(x)"),
    ]
    return "\n".join(lines)


def _module(args: str, call: str) -> list[str]:
    return [
        "",
        "",
        "class ModelNew(nn.Module):",
        "    def __init__(self):",
        "        super().__init__()",
        "",
        f"    def forward(self, {args}):",
        f"        return {call}",
        "",
    ]


# ------------------------------------------------------------------------------ dimension 1
def _dim_loop(body: list[str], prologue: list[str]) -> list[str]:
    """A pass over dimension 1: each tile of rows loaded, upcast, the prologue, then ``body``."""
    load = [
        "rows = r0 + tl.arange(0, BLOCK_M)",
        "mask = (rows[:, None] < D1) & col_mask[None, :]",
        "offs = base + rows[:, None].to(tl.int64) * D2 + cols[None, :]",
        "h = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)",
    ]
    return ["for r0 in range(0, D1, BLOCK_M):", *_indent(load + prologue + body)]


def _dim_passes(kind: str, prologue: list[str], epilogue: list[str]) -> list[str]:
    zeros = "tl.zeros([BLOCK_N], dtype=tl.float32)"
    store = ["tl.store(out_ptr + offs, h.to(out_ptr.dtype.element_ty), mask=mask)"]
    if kind in DIM_REDUCING:
        if kind in ("amax_dim", "amin_dim"):
            pick, bound = ("maximum", '"-inf"') if kind == "amax_dim" else ("minimum", '"inf"')
            reduce = "max" if kind == "amax_dim" else "min"
            init = f"acc = tl.full([BLOCK_N], float({bound}), tl.float32)"
            step = f"acc = tl.{pick}(acc, tl.{reduce}(tl.where(mask, h, float({bound})), axis=0))"
            final = "h = acc"
        else:
            init, step = f"acc = {zeros}", "acc += tl.sum(tl.where(mask, h, 0.0), axis=0)"
            final = "h = acc / D1" if kind == "mean_dim" else "h = acc"
        out = [
            "tl.store(out_ptr + b.to(tl.int64) * D2 + cols, h.to(out_ptr.dtype.element_ty), "
            "mask=col_mask)"
        ]
        return [init, *_dim_loop([step], prologue), final, *epilogue, *out]
    if kind == "softmax_dim":
        return [
            'mx = tl.full([BLOCK_N], float("-inf"), tl.float32)',
            *_dim_loop(
                ['mx = tl.maximum(mx, tl.max(tl.where(mask, h, float("-inf")), axis=0))'],
                prologue,
            ),
            "mx = tl.where(col_mask, mx, 0.0)",
            f"acc = {zeros}",
            *_dim_loop(
                ["acc += tl.sum(tl.where(mask, tl.exp(h - mx[None, :]), 0.0), axis=0)"], prologue
            ),
            "acc = tl.where(col_mask, acc, 1.0)",
            *_dim_loop(["h = tl.exp(h - mx[None, :]) / acc[None, :]", *epilogue, *store], prologue),
        ]
    if kind == "rms_norm_dim":
        return [
            f"acc = {zeros}",
            *_dim_loop(["acc += tl.sum(tl.where(mask, h * h, 0.0), axis=0)"], prologue),
            "scale = 1.0 / tl.sqrt(acc / D1 + 1e-6)",
            *_dim_loop(["h = h * scale[None, :]", *epilogue, *store], prologue),
        ]
    raise ValueError(f"not a dimension-1 core: {kind}")


def _dim_solution(graph: Graph) -> str:
    prologue, epilogue = _split(graph)
    kind = graph.core.kind
    body = [
        "b = tl.program_id(0)",
        "cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)",
        "col_mask = cols < D2",
        "base = b.to(tl.int64) * D1 * D2",
        *_dim_passes(kind, prologue, epilogue),
    ]
    shape = "(x.shape[0], 1, x.shape[2])" if kind in DIM_REDUCING else "x.shape"
    lines = _header() + [
        "@triton.jit",
        "def dim1_kernel(x_ptr, out_ptr, D1, D2, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):",
        *_indent(body),
        "",
        "",
        "def over_dim1(x):",
        "    x = x.contiguous()",
        "    batch, d1, d2 = x.shape",
        f"    out = torch.empty({shape}, dtype=x.dtype, device=x.device)",
        f"    grid = (batch, triton.cdiv(d2, {DIM_BLOCK_N}))",
        f"    dim1_kernel[grid](x, out, d1, d2, BLOCK_M={DIM_BLOCK_M}, BLOCK_N={DIM_BLOCK_N})",
        "    return out",
        *_module("x", "over_dim1(x)"),
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------------------ matmul
#: Per product: (M, K, N, batches, A's batch/row/k strides, B's batch/k/column strides), as
#: expressions of the launcher's ``a`` and ``b``: a transposed operand is read through its
#: swapped strides.
_MATMUL_LAUNCH = {
    "matmul": ("a.shape[0]", "a.shape[1]", "b.shape[1]", "1", "0, a.stride(0), a.stride(1)", "0, b.stride(0), b.stride(1)"),
    "matmul_ta": ("a.shape[1]", "a.shape[0]", "b.shape[1]", "1", "0, a.stride(1), a.stride(0)", "0, b.stride(0), b.stride(1)"),
    "matmul_tb": ("a.shape[0]", "a.shape[1]", "b.shape[0]", "1", "0, a.stride(0), a.stride(1)", "0, b.stride(1), b.stride(0)"),
    "bmm": ("a.shape[1]", "a.shape[2]", "b.shape[2]", "a.shape[0]", "a.stride(0), a.stride(1), a.stride(2)", "b.stride(0), b.stride(1), b.stride(2)"),
}  # fmt: skip


def _matmul_solution(graph: Graph) -> str:
    _, epilogue = _split(graph)
    m, k, n, batches, a_strides, b_strides = _MATMUL_LAUNCH[graph.core.kind]
    body = [
        "pid_m = tl.program_id(0)",
        "pid_n = tl.program_id(1)",
        "batch = tl.program_id(2).to(tl.int64)",
        "rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        "cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
        "ks = tl.arange(0, BLOCK_K)",
        "acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)",
        "for k0 in range(0, K, BLOCK_K):",
        "    k = (k0 + ks).to(tl.int64)",
        "    a = tl.load(a_ptr + batch * sa_b + rows[:, None].to(tl.int64) * sa_m + k[None, :] * sa_k, "
        "mask=(rows[:, None] < M) & (k[None, :] < K), other=0.0).to(tl.float32)",
        "    b = tl.load(b_ptr + batch * sb_b + k[:, None] * sb_k + cols[None, :].to(tl.int64) * sb_n, "
        "mask=(k[:, None] < K) & (cols[None, :] < N), other=0.0).to(tl.float32)",
        '    acc = tl.dot(a, b, acc, input_precision="ieee")',
        "h = acc",
        *epilogue,
        "out = out_ptr + batch * M * N + rows[:, None].to(tl.int64) * N + cols[None, :]",
        "tl.store(out, h.to(out_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))",
    ]
    out_shape = "(batches, m, n)" if graph.core.kind == "bmm" else "(m, n)"
    lines = _header() + [
        "@triton.jit",
        "def matmul_kernel(a_ptr, b_ptr, out_ptr, M, N, K, sa_b, sa_m, sa_k, sb_b, sb_k, sb_n,",
        "                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):",
        *_indent(body),
        "",
        "",
        "def tiled_matmul(a, b):",
        f"    m, k, n, batches = {m}, {k}, {n}, {batches}",
        f"    out = torch.empty({out_shape}, dtype=a.dtype, device=a.device)",
        f"    grid = (triton.cdiv(m, {TILE}), triton.cdiv(n, {TILE}), batches)",
        f"    matmul_kernel[grid](a, b, out, m, n, k, {a_strides}, {b_strides},",
        f"                        BLOCK_M={TILE}, BLOCK_N={TILE}, BLOCK_K={TILE})",
        "    return out",
        *_module("a, b", "tiled_matmul(a, b)"),
    ]
    return "\n".join(lines)


def explain_for(graph: Graph) -> str:
    """The short reasoning written before any graph's reference solution in its SFT record."""
    steps = ", ".join(op.kind for op in graph.ops if op is not graph.core) or "nothing else"
    if graph.family == "long_row":
        core = graph.core.kind if graph.core is not None else "a pointwise chain"
        return (
            f"Each row is far longer than one block ({core} over the last dimension), so one "
            f"program per row loops over it in blocks of {LONG_BLOCK}: a pass per quantity the "
            "core needs (a maximum, a sum, a mean or a variance, accumulated in fp32 with masked "
            "lanes neutralised), then a last pass that writes the outputs; the pointwise "
            f"operators ({steps}) are applied to every block loaded and to the outputs."
        )
    if graph.family == "dim_reduction":
        return (
            f"{graph.core.kind} runs over dimension 1 of (batch, dim1, dim2), not the last: each "
            f"program owns {DIM_BLOCK_N} columns of one batch and loops over dim1 in tiles of "
            f"{DIM_BLOCK_M} rows, accumulating per column in fp32 (masked rows and columns "
            f"neutralised), with a pass per quantity the core needs; then {steps}."
        )
    if graph.family == "tiled_matmul":
        return (
            f"A tiled matrix product ({graph.core.kind}): each program owns a {TILE}x{TILE} output "
            f"tile and accumulates tl.dot over K in fp32; a transposed operand is read through "
            "its swapped strides (nothing is copied), a batched one through the grid's third "
            f"axis; then {steps} on the accumulator before one masked store."
        )
    return explain(graph)
