"""Difficulty tags: operators and their categories (AST), reference runtime, model pass rate.

- ``ops`` / ``op_categories``: read from the AST of the task (never executed): calls and
  operators in the module outside the input generators, with ``nn`` layer constructors counted
  as the operators they are. The categories say what kind of kernel a solution needs; a task
  without a category gets one from them (``infer_category``).
- ``runtime_bucket``: the reference's median runtime measured by ``validate`` on its device.
- ``pass_rate`` (optional): the share of ``k`` samples of a model that the environment judged
  correct, through the pool; ``generate`` is given by the caller (``launch`` owns models).
- ``difficulty``: from the pass rate when there is one (easy >= 0.5 > medium > 0 = hard),
  otherwise from the structure (see ``structural_difficulty``).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from datasets import Dataset
from rich.console import Console

from kernelrl.data.curate.report import StepReport, log_step, step_progress, timed
from kernelrl.data.curate.resume import Journal
from kernelrl.data.schema import make_dataset
from kernelrl.env.integrity.vocabulary import ALLOCATION_OPS
from kernelrl.env.pools import Pool
from kernelrl.env.task import task_from_row

# Generation callable: prompts (message lists) and k -> k completions per prompt.
Generate = Callable[[Sequence[list[dict[str, str]]], int], list[list[str]]]

_CATEGORY_OPS: dict[str, tuple[str, ...]] = {
    "matmul": (
        "matmul",
        "mm",
        "bmm",
        "addmm",
        "baddbmm",
        "addbmm",
        "einsum",
        "linear",
        "bilinear",
        "dot",
        "mv",
        "addmv",
        "outer",
        "tensordot",
        "@",
    ),
    "convolution": (
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
        "convtranspose1d",
        "convtranspose2d",
        "convtranspose3d",
        "unfold",
        "fold",
    ),
    "pooling": (
        "max_pool1d",
        "max_pool2d",
        "max_pool3d",
        "avg_pool1d",
        "avg_pool2d",
        "avg_pool3d",
        "adaptive_avg_pool1d",
        "adaptive_avg_pool2d",
        "adaptive_avg_pool3d",
        "adaptive_max_pool2d",
        "maxpool1d",
        "maxpool2d",
        "maxpool3d",
        "avgpool1d",
        "avgpool2d",
        "avgpool3d",
        "adaptiveavgpool1d",
        "adaptiveavgpool2d",
        "adaptiveavgpool3d",
        "adaptivemaxpool2d",
        "lppool2d",
    ),
    "normalization": (
        "layer_norm",
        "layernorm",
        "batch_norm",
        "batchnorm1d",
        "batchnorm2d",
        "batchnorm3d",
        "group_norm",
        "groupnorm",
        "instance_norm",
        "instancenorm1d",
        "instancenorm2d",
        "instancenorm3d",
        "rms_norm",
        "rmsnorm",
        "normalize",
        "local_response_norm",
        "localresponsenorm",
    ),
    "softmax": ("softmax", "log_softmax", "logsoftmax", "softmin", "logsumexp"),
    "reduction": (
        "sum",
        "mean",
        "amax",
        "amin",
        "max",
        "min",
        "argmax",
        "argmin",
        "prod",
        "var",
        "std",
        "norm",
        "all",
        "any",
        "median",
        "count_nonzero",
        "nansum",
        "var_mean",
        "std_mean",
    ),
    "scan": ("cumsum", "cumprod", "cummax", "cummin", "logcumsumexp"),
    "activation": (
        "relu",
        "relu6",
        "gelu",
        "silu",
        "sigmoid",
        "tanh",
        "elu",
        "selu",
        "celu",
        "leaky_relu",
        "leakyrelu",
        "hardtanh",
        "softplus",
        "softsign",
        "mish",
        "hardswish",
        "hardsigmoid",
        "logsigmoid",
        "glu",
        "prelu",
        "threshold",
        "swish",
        "tanhshrink",
        "softshrink",
        "hardshrink",
    ),
    "elementwise": (
        "add",
        "sub",
        "mul",
        "div",
        "true_divide",
        "pow",
        "exp",
        "exp2",
        "expm1",
        "log",
        "log2",
        "log1p",
        "sqrt",
        "rsqrt",
        "abs",
        "neg",
        "clamp",
        "clip",
        "where",
        "maximum",
        "minimum",
        "reciprocal",
        "sin",
        "cos",
        "erf",
        "erfc",
        "floor",
        "ceil",
        "round",
        "sign",
        "square",
        "masked_fill",
        "lerp",
        "addcmul",
        "addcdiv",
        "fmod",
        "remainder",
        "+",
        "-",
        "*",
        "/",
        "//",
        "%",
        "**",
        "neg()",
        "eq",
        "ne",
        "gt",
        "lt",
        "ge",
        "le",
        "logical_and",
        "logical_or",
        "bitwise_and",
    ),
    "attention": ("scaled_dot_product_attention", "multiheadattention", "flash_attention"),
    "loss": (
        "mse_loss",
        "cross_entropy",
        "nll_loss",
        "kl_div",
        "l1_loss",
        "smooth_l1_loss",
        "huber_loss",
        "binary_cross_entropy",
        "binary_cross_entropy_with_logits",
        "triplet_margin_loss",
        "hinge_embedding_loss",
        "cosine_embedding_loss",
        "margin_ranking_loss",
        "cosine_similarity",
        "pairwise_distance",
        "cdist",
        "mseloss",
        "crossentropyloss",
        "nllloss",
        "kldivloss",
        "l1loss",
        "smoothl1loss",
        "huberloss",
        "bceloss",
        "bcewithlogitsloss",
        "tripletmarginloss",
        "hingeembeddingloss",
    ),
    "indexing": (
        "gather",
        "scatter",
        "scatter_add",
        "index_select",
        "masked_select",
        "take",
        "take_along_dim",
        "embedding",
        "one_hot",
        "index_add",
        "sort",
        "argsort",
        "topk",
        "kthvalue",
        "searchsorted",
        "bucketize",
        "unique",
        "nonzero",
    ),
    "layout": (
        "view",
        "reshape",
        "transpose",
        "permute",
        "flatten",
        "unflatten",
        "unsqueeze",
        "squeeze",
        "cat",
        "concat",
        "stack",
        "split",
        "chunk",
        "expand",
        "expand_as",
        "repeat",
        "repeat_interleave",
        "contiguous",
        "t",
        "pad",
        "flip",
        "roll",
        "narrow",
        "tril",
        "triu",
        "diag",
        "diagonal",
        "pixel_shuffle",
        "pixel_unshuffle",
        "interpolate",
        "upsample",
        "clone",
        "to",
        "float",
        "half",
        "bfloat16",
        "type",
    ),
    "recurrent": ("lstm", "gru", "rnn", "lstmcell", "grucell", "rnncell"),
}
OP_CATEGORY: dict[str, str] = {
    op: category for category, ops in _CATEGORY_OPS.items() for op in ops
}
# Calls that are not operators of the computation.
# Allocation comes from the shared op vocabulary (``env.vocabulary``), so curation and the
# integrity checks agree on what is not computation; the rest is Python and nn plumbing.
_IGNORED = """
super __init__ size dim shape numel len range int float bool isinstance print tuple list dict
linspace randn rand randint randn_like rand_like manual_seed no_grad dropout dropout2d identity
parameter register_buffer register_parameter modulelist sequential item detach cpu cuda
contiguous_format device dtype
"""
IGNORED_CALLS = frozenset(_IGNORED.split()) | ALLOCATION_OPS
_BINOPS = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
    ast.MatMult: "@",
}
HEAVY = {"matmul", "convolution", "attention", "recurrent"}
MEDIUM = {"normalization", "softmax", "scan", "loss", "pooling", "indexing"}


def _call_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def task_ops(source: str) -> list[str]:
    """Operator names the task's computation uses (sorted, distinct), from its AST."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    ops: set[str] = set()
    skipped = {"get_inputs", "get_init_inputs", "KERNELRL"}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in skipped:
            continue
        if isinstance(node, ast.Assign | ast.AnnAssign | ast.Import | ast.ImportFrom):
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.Call):
                name = _call_name(sub.func)
                if name is None or name.lower() in IGNORED_CALLS:
                    continue
                # self.layer(x): the layer's constructor in __init__ already names the op.
                if (
                    isinstance(sub.func, ast.Attribute)
                    and isinstance(sub.func.value, ast.Name)
                    and sub.func.value.id == "self"
                ):
                    continue
                ops.add(name.lower())
            elif isinstance(sub, ast.BinOp | ast.AugAssign):
                symbol = _BINOPS.get(type(sub.op))
                if symbol:
                    ops.add(symbol)
    return sorted(ops)


def op_categories(ops: Sequence[str]) -> list[str]:
    return sorted({OP_CATEGORY.get(op, "other") for op in ops})


def infer_category(ops: Sequence[str]) -> str:
    """A task category from its operators: the one compute category, or ``fused``."""
    categories = set(op_categories([op for op in ops if OP_CATEGORY.get(op) != "layout"])) - {
        "other"
    }
    if categories <= {"elementwise", "activation"} and categories:
        return "elementwise"
    if len(categories) == 1:
        return next(iter(categories))
    return "fused" if categories else "uncategorized"


def structural_difficulty(ops: Sequence[str]) -> str:
    """hard: attention, recurrence, or a matmul/conv fused with 3+ other compute ops, or 6+ ops;
    medium: any matmul/conv/norm/softmax/scan/loss/pooling/indexing, or 3+ compute ops;
    easy: up to two elementwise, activation or reduction ops."""
    compute = [op for op in ops if OP_CATEGORY.get(op) != "layout"]
    categories = set(op_categories(compute))
    if categories & {"attention", "recurrent"} or len(compute) >= 6:
        return "hard"
    if categories & HEAVY and len(compute) >= 4:
        return "hard"
    if categories & (HEAVY | MEDIUM) or len(compute) >= 3:
        return "medium"
    return "easy"


def runtime_bucket(runtime_ms: float | None) -> str | None:
    if runtime_ms is None:
        return None
    for limit, label in ((0.1, "<0.1ms"), (1.0, "0.1-1ms"), (10.0, "1-10ms"), (100.0, "10-100ms")):
        if runtime_ms < limit:
            return label
    return ">=100ms"


def pass_difficulty(pass_rate: float) -> str:
    return "easy" if pass_rate >= 0.5 else "medium" if pass_rate > 0 else "hard"


@dataclass
class DifficultyConfig:
    k: int = 4  # samples per task for the pass rate
    min_pass_rate: float | None = None  # drop tasks below (e.g. never solved)
    max_pass_rate: float | None = None  # drop tasks above (e.g. always solved: no RL signal)


def pass_rates(tasks: Dataset, generate: Generate, pool: Pool, k: int) -> list[float]:
    """Share of ``k`` generated samples per task that the environment judged correct."""
    rows = list(tasks)
    completions = generate([row["prompt"] for row in rows], k)
    env_tasks = [task_from_row(row) for row in rows for _ in range(k)]
    flat = [c for per_task in completions for c in per_task]
    if len(flat) != len(env_tasks):
        raise ValueError(f"generate returned {len(flat)} completions for {len(rows)} tasks x k={k}")
    results = pool.evaluate(env_tasks, flat)
    return [sum(r.correct for r in results[i * k : (i + 1) * k]) / k for i in range(len(rows))]


def journaled_pass_rates(
    tasks: Dataset,
    generate: Generate,
    pool: Pool,
    k: int,
    journal: Journal | None = None,
    console: Console | None = None,
    chunk: int = 16,
) -> list[float]:
    """``pass_rates`` in chunks of tasks, each task's rate journaled as its chunk ends (an
    interrupted run resumes), with a progress bar on ``console``."""
    rows = list(tasks)
    hashes = [task_from_row(row).hash for row in rows]
    rates: dict[int, float] = {}
    for i, task_hash in enumerate(hashes):
        entry = journal.get(task_hash) if journal is not None else None
        if entry is not None:
            rates[i] = float(entry["pass_rate"])
    todo = [i for i in range(len(rows)) if i not in rates]
    with step_progress(console, f"pass rate (k={k})", len(rows), len(rates)) as progress:
        for start in range(0, len(todo), chunk):
            part = todo[start : start + chunk]
            part_rates = pass_rates(tasks.select(part), generate, pool, k)
            for i, rate in zip(part, part_rates, strict=True):
                rates[i] = rate
                if journal is not None:
                    journal.add(hashes[i], rows[i]["id"], {"pass_rate": rate})
            progress.advance(len(part))
    return [rates[i] for i in range(len(rows))]


def tag_difficulty(
    tasks: Dataset,
    config: DifficultyConfig | None = None,
    generate: Generate | None = None,
    pool: Pool | None = None,
    console: Console | None = None,
    journal: Journal | None = None,
) -> tuple[Dataset, StepReport]:
    """Add ops, categories, runtime bucket, pass rate (with a model) and difficulty."""
    config = config or DifficultyConfig()
    report = StepReport("difficulty", count_in=len(tasks))
    with timed(report):
        rates: list[float | None] = [None] * len(tasks)
        if generate is not None:
            if pool is None:
                raise ValueError("a pass rate needs a pool to evaluate the samples")
            rates = list(journaled_pass_rates(tasks, generate, pool, config.k, journal, console))
            report.notes["pass_rate_k"] = config.k
        rows: list[dict[str, Any]] = []
        for row, rate in zip(tasks, rates, strict=True):
            ops = task_ops(row["source"])
            out = {
                **row,
                "category": row["category"]
                if row["category"] not in (None, "uncategorized")
                else infer_category(ops),
                "ops": ops,
                "op_categories": op_categories(ops),
                "num_ops": len([op for op in ops if OP_CATEGORY.get(op) != "layout"]),
                "runtime_bucket": runtime_bucket(row.get("ref_runtime_ms")),
                "pass_rate": rate,
                "pass_k": config.k if rate is not None else None,
                "difficulty": pass_difficulty(rate)
                if rate is not None
                else structural_difficulty(ops),
            }
            if (
                rate is not None
                and config.min_pass_rate is not None
                and rate < config.min_pass_rate
            ):
                report.remove(
                    row["id"], "pass_rate_too_low", f"pass rate {rate:.2f} < {config.min_pass_rate}"
                )
                continue
            if (
                rate is not None
                and config.max_pass_rate is not None
                and rate > config.max_pass_rate
            ):
                report.remove(
                    row["id"],
                    "pass_rate_too_high",
                    f"pass rate {rate:.2f} > {config.max_pass_rate}",
                )
                continue
            rows.append(out)
    result = make_dataset(rows, "tasks")
    report.count_out = len(result)
    log_step(report, console)
    return result, report
