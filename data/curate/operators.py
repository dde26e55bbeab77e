"""The operators a task computes with, read from its AST (never executed), and their categories.

Calls and operators in the module outside the input generators count, with ``nn`` layer
constructors counted as the operators they are (``self.layer(x)`` is named by the layer's
constructor in ``__init__``). Categories say what kind of kernel a solution needs; a task
without a category gets one from them (``infer_category``). Curation tags tasks with them
(``difficulty``), and evaluation sweeps group KernelBench tasks by them (``eval.benchmarks``).
"""

from __future__ import annotations

import ast
from collections.abc import Sequence

from kernelrl.env.integrity.vocabulary import ALLOCATION_OPS
from kernelrl.env.python_syntax import parse_python

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


def _call_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def task_ops(source: str) -> list[str]:
    """Operator names the task's computation uses (sorted, distinct), from its AST."""
    try:
        tree = parse_python(source)
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
