"""The typed operator graph a synthetic task is made from, and how one is drawn from a seed.

A task is one chain over a tensor ``x``: a prologue of pointwise operators, at most one *core*
operator (a row reduction, softmax / log-softmax, a norm, or a linear layer), and an epilogue
of pointwise operators. Every operator knows its effect on the shape (``Shape``): a core may
reduce the last dimension to 1 (keepdim) or replace it (linear); pointwise operators keep it.
Operators that read a second tensor (a row vector broadcast over rows, a column broadcast over
the last dimension, a full second input) are typed against the shape *at their position*, so a
broadcast never silently widens a reduced tensor. The task source (``render``) and its Triton
reference solution (``triton_ref``) are both written from this graph, which is why the
generator can promise that a task's code does what its tags say.

Numerical guards are part of drawing, because the in-process check (``check``) runs real
values only at the CPU sizes, and a sum over a GPU-sized row grows with its length: operators
that grow values (``exp``, ``square``) appear at most once, never after a sum (a sum of 8192
normal values reaches 300, whose exp overflows fp32) and never before a sum in half precision;
``exp`` only follows the input or an operator whose output stays small (``EXP_AFTER``).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from typing import Any

#: Pointwise operators without parameters.
UNARY = ("relu", "sigmoid", "tanh", "gelu", "silu", "exp", "abs", "neg", "square", "softplus")
#: Pointwise operators with a scalar parameter (drawn from ``SCALARS``).
SCALAR = ("add_scalar", "mul_scalar", "clamp", "leaky_relu")
#: Pointwise operators reading a second tensor: (N,) row vector, (..., 1) column, full shape.
OPERAND = ("add_row", "mul_row", "add_col", "mul_col", "add_input", "mul_input")
POINTWISE = UNARY + SCALAR + OPERAND
#: Core operators over the last dimension, and the family each belongs to.
CORE_FAMILY = {
    "sum": "reduction",
    "mean": "reduction",
    "amax": "reduction",
    "softmax": "softmax",
    "log_softmax": "softmax",
    "layer_norm": "norm",
    "rms_norm": "norm",
    "l2_normalize": "norm",
    "linear": "matmul",
    # Layouts the one-block row template cannot express (``LAYOUT_FAMILIES``): a core over
    # dimension 1 of a 3-d tensor, and tiled matrix products of two inputs.
    "sum_dim": "dim_reduction",
    "mean_dim": "dim_reduction",
    "amax_dim": "dim_reduction",
    "amin_dim": "dim_reduction",
    "softmax_dim": "dim_reduction",
    "rms_norm_dim": "dim_reduction",
    "matmul": "tiled_matmul",
    "matmul_ta": "tiled_matmul",
    "matmul_tb": "tiled_matmul",
    "bmm": "tiled_matmul",
}
REDUCING = ("sum", "mean", "amax")
#: Cores reducing dimension 1 to size 1 (keepdim).
DIM_REDUCING = ("sum_dim", "mean_dim", "amax_dim", "amin_dim")

GROWING = ("exp", "square")
#: What ``exp`` may follow (None: the input itself, a standard normal): operators whose output is
#: bounded, or of unit scale, whatever the row length. After a chain of multiplications by other
#: inputs a value reaches 100 somewhere among millions of elements, and exp(100) overflows fp32.
EXP_AFTER = (None, "sigmoid", "tanh", "clamp", "softmax", "log_softmax", "layer_norm", "rms_norm")
EXP_AFTER += ("l2_normalize", "linear", "softmax_dim", "rms_norm_dim")
EXP_AFTER += ("matmul", "matmul_ta", "matmul_tb", "bmm")
FAMILIES = ("elementwise", "reduction", "softmax", "norm", "matmul")
#: Families of KernelBench level 1 that one program per row with the row in one block cannot
#: express: rows longer than a block (the kernel loops over the row), a core over a dimension
#: other than the last, and tiled products of two matrices. Float32 only, as level 1 is; only
#: unary and scalar pointwise operators around the core. Drawn only when a recipe names them.
LAYOUT_FAMILIES = ("long_row", "dim_reduction", "tiled_matmul")
ALL_FAMILIES = FAMILIES + LAYOUT_FAMILIES
#: The cores a long row may have (None: a pointwise chain); every row core but the linear layer.
LONG_ROW_CORES = (None, "sum", "mean", "amax", "softmax", "log_softmax", "layer_norm", "rms_norm")
LONG_ROW_CORES += ("l2_normalize",)
DTYPES = ("float32", "float16", "bfloat16")

SCALARS: dict[str, tuple[Any, ...]] = {
    "add_scalar": (0.5, -0.25, 1.0, 0.125, -1.5),
    "mul_scalar": (0.5, 2.0, -1.0, 0.25, 1.5),
    "clamp": ((-1.0, 1.0), (-0.5, 0.5), (0.0, 2.0), (-2.0, 0.25)),
    "leaky_relu": (0.01, 0.1, 0.2),
}


def pointwise_in(combination: str) -> int:
    """``Graph.pointwise`` read back from a combination (``Graph.combination``)."""
    return sum(
        kind not in CORE_FAMILY and kind not in LAYOUT_FAMILIES for kind in combination.split(">")
    )


@dataclass(frozen=True)
class Op:
    """One operator and its parameter (a scalar, a (lo, hi) pair, or None)."""

    kind: str
    param: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "param": list(self.param) if isinstance(self.param, tuple) else self.param,
        }


@dataclass(frozen=True)
class Shape:
    """Sizes of one task, by the name of the module global that holds each."""

    dims: tuple[tuple[str, int], ...]  # x's dimensions; the last one is the row length
    linear: tuple[tuple[str, int], ...] = ()  # (in_features, out_features) for a linear core

    @property
    def values(self) -> dict[str, int]:
        return dict(self.dims) | dict(self.linear)


@dataclass(frozen=True)
class Graph:
    """A synthetic task: dtype, sizes per device kind, and the operator chain."""

    family: str
    dtype: str
    prologue: tuple[Op, ...]
    core: Op | None
    epilogue: tuple[Op, ...]
    sizes: dict[str, Shape] = field(hash=False, compare=True)  # "cpu" and "cuda"

    @property
    def ops(self) -> tuple[Op, ...]:
        return self.prologue + ((self.core,) if self.core else ()) + self.epilogue

    @property
    def pointwise(self) -> int:
        """How many pointwise operators the chain holds: the length a reference tier bounds."""
        return len(self.prologue) + len(self.epilogue)

    @property
    def combination(self) -> str:
        """The operator kinds in order: what the held-out split keeps apart from training. A
        long row is named as such first: the same chain over a short row is another task."""
        kinds = [op.kind for op in self.ops]
        return ">".join(["long_row", *kinds] if self.family == "long_row" else kinds)

    def key(self, size_profile: str = "cuda") -> str:
        """Everything that makes two tasks the same problem: operators, parameters, dtype and
        the sizes of the module globals (``size_profile``'s). The other kind's sizes only make
        the task runnable elsewhere: two tasks that differ only there are one problem, as
        curation's dedup (which reads the globals) also finds."""
        data = self.to_dict()
        data["sizes"] = data["sizes"][size_profile]
        return json.dumps(data, sort_keys=True)

    def to_dict(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "dtype": self.dtype,
            "prologue": [op.to_dict() for op in self.prologue],
            "core": self.core.to_dict() if self.core else None,
            "epilogue": [op.to_dict() for op in self.epilogue],
            "sizes": {kind: asdict(shape) for kind, shape in self.sizes.items()},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Graph:
        def op(d: dict[str, Any]) -> Op:
            param = d["param"]
            return Op(d["kind"], tuple(param) if isinstance(param, list) else param)

        def shape(d: dict[str, Any]) -> Shape:
            return Shape(
                tuple((str(k), int(v)) for k, v in d["dims"]),
                tuple((str(k), int(v)) for k, v in d["linear"]),
            )

        return cls(
            family=data["family"],
            dtype=data["dtype"],
            prologue=tuple(op(d) for d in data["prologue"]),
            core=op(data["core"]) if data["core"] else None,
            epilogue=tuple(op(d) for d in data["epilogue"]),
            sizes={kind: shape(s) for kind, s in data["sizes"].items()},
        )

    def output_shape(self, kind: str) -> tuple[int, ...]:
        """The output's shape at the sizes of ``kind``: what the meta check compares with."""
        shape = self.sizes[kind]
        dims = [v for _, v in shape.dims]
        if self.family == "tiled_matmul":
            values = shape.values
            return (
                *([values["batch_size"]] if "batch_size" in values else []),
                values["M"],
                values["N"],
            )
        if self.core is not None and self.core.kind in DIM_REDUCING:
            dims[1] = 1
        if self.core is not None and self.core.kind in REDUCING:
            dims[-1] = 1
        if self.core is not None and self.core.kind == "linear":
            dims[-1] = dict(shape.linear)["out_features"]
        return tuple(dims)


@dataclass
class SizeProfile:
    """Where the sizes of a task are drawn from, per device kind: rows and row lengths."""

    rows: tuple[int, ...]
    cols: tuple[int, ...]
    batch: tuple[int, ...]
    features: tuple[int, ...]


#: CPU sizes run in about a second under the Triton interpreter; GPU sizes are KernelBench-like
#: (level 1 and 2 use rows of thousands and row lengths of 1k-16k).
PROFILES: dict[str, SizeProfile] = {
    "cpu": SizeProfile(
        rows=(4, 8, 16, 24, 32),
        cols=(16, 33, 48, 64, 100, 128, 200, 256),
        batch=(2, 3, 4),
        features=(16, 24, 32, 48, 64),
    ),
    "cuda": SizeProfile(
        rows=(1024, 2048, 4096, 8192),
        cols=(512, 1000, 1024, 2048, 4096, 8192),
        batch=(8, 16, 32),
        features=(512, 1024, 2048, 4096),
    ),
}


#: Sizes of the layout families per device kind and size global. CPU rows are longer than
#: the long-row references' block (1024) and CPU dim-1 lengths longer than the dim references'
#: block (16 rows), so that their loops run under the interpreter too; GPU sizes are level 1's
#: kind (rows of 32k-393k, dim-1 reductions over thousands, square and batched products).
LAYOUT_SIZES: dict[str, dict[str, dict[str, tuple[int, ...]]]] = {
    "long_row": {
        "cpu": {"batch_size": (2, 3, 4), "dim": (1100, 1500, 2100, 3000, 4100)},
        "cuda": {
            "batch_size": (128, 256, 512, 1024),
            "dim": (32768, 65536, 131072, 262144, 393216),
        },
    },
    "dim_reduction": {
        "cpu": {"batch_size": (2, 3), "dim1": (20, 33, 64), "dim2": (16, 48, 100)},
        "cuda": {"batch_size": (16, 32, 64), "dim1": (256, 1024, 2048), "dim2": (256, 1023, 2048)},
    },
    "tiled_matmul": {
        "cpu": {"M": (16, 24, 40, 64), "N": (16, 32, 48, 64), "K": (16, 32, 48, 64)},
        "cuda": {
            "M": (512, 1024, 2048, 4096),
            "N": (512, 1024, 2048, 4096),
            "K": (256, 1024, 4096),
        },
    },
    "bmm": {
        "cpu": {"batch_size": (2, 3), "M": (16, 24, 40), "N": (16, 32, 48), "K": (16, 32, 48)},
        "cuda": {
            "batch_size": (8, 16, 32),
            "M": (256, 512, 1024),
            "N": (256, 512, 1024),
            "K": (256, 1024),
        },
    },
}
#: The order of each layout's size globals in ``Shape.dims``.
LAYOUT_DIMS = {
    "long_row": ("batch_size", "dim"),
    "dim_reduction": ("batch_size", "dim1", "dim2"),
    "tiled_matmul": ("M", "K", "N"),
    "bmm": ("batch_size", "M", "K", "N"),
}


def _layout_shape(rng: random.Random, table: str, kind: str) -> Shape:
    sizes = LAYOUT_SIZES[table][kind]
    return Shape(tuple((name, rng.choice(sizes[name])) for name in LAYOUT_DIMS[table]))


def _draw_layout(rng: random.Random, family: str, config: DrawConfig) -> Graph:
    """A graph of a layout family (``LAYOUT_FAMILIES``): float32, unary and scalar pointwise
    operators around the core, with the growth guards of every other family."""
    allowed = UNARY + SCALAR
    guard: set[str] = set()
    cores = (
        LONG_ROW_CORES
        if family == "long_row"
        else tuple(sorted(k for k, f in CORE_FAMILY.items() if f == family))
    )
    core_kind = rng.choice(cores)
    if core_kind is None:
        count = rng.randint(1, config.max_pointwise)
        prologue, epilogue = _pointwise(rng, count, False, guard, allowed=allowed), []
    else:
        budget = rng.randint(0, config.max_pointwise - 1)
        n_pro = 0 if family == "tiled_matmul" else rng.randint(0, budget)
        prologue = _pointwise(rng, n_pro, False, guard, allowed=allowed)
        growing = core_kind not in ("sum", "sum_dim")
        epilogue = _pointwise(
            rng, budget - n_pro, False, guard, growing, previous=core_kind, allowed=allowed
        )
    table = "bmm" if core_kind == "bmm" else family
    sizes = {kind: _layout_shape(random.Random(rng.random()), table, kind) for kind in PROFILES}
    core = Op(core_kind) if core_kind is not None else None
    return Graph(family, "float32", tuple(prologue), core, tuple(epilogue), sizes)


@dataclass
class DrawConfig:
    """What ``draw`` may produce: families with their weights, dtypes with theirs, chain lengths."""

    families: dict[str, float]
    dtypes: dict[str, float]
    max_pointwise: int = 4
    rank3_share: float = 0.3


def _weighted(rng: random.Random, weights: dict[str, float]) -> str:
    names = sorted(weights)
    return rng.choices(names, weights=[weights[n] for n in names], k=1)[0]


def _pointwise(
    rng: random.Random,
    count: int,
    reduced: bool,
    guard: set[str],
    growing: bool = True,
    previous: str | None = None,
    allowed: tuple[str, ...] = POINTWISE,
) -> list[Op]:
    """``count`` pointwise operators; ``reduced``: after a row reduction, where a row vector
    does not fit and a full second input has the column's shape (one name per computation:
    ``add_col``, so that dedup by graph finds what dedup by computation finds);
    ``guard``: growing operators already used (at most one per task); ``growing``: whether
    one may be drawn here at all; ``previous``: the operator before the first one drawn here
    (``EXP_AFTER``); ``allowed``: the operators that may be drawn at all."""
    ops: list[Op] = []
    after_reduction = ("add_row", "mul_row", "add_input", "mul_input")
    for _ in range(count):
        choices = [k for k in allowed if not (reduced and k in after_reduction)]
        if guard or not growing:
            choices = [k for k in choices if k not in GROWING]
        if previous not in EXP_AFTER:
            choices = [k for k in choices if k != "exp"]
        kind = previous = rng.choice(choices)
        if kind in GROWING:
            guard.add(kind)
        param = rng.choice(SCALARS[kind]) if kind in SCALARS else None
        ops.append(Op(kind, param))
    return ops


def _shape(rng: random.Random, profile: SizeProfile, rank3: bool, linear: bool) -> Shape:
    if linear:
        dims = (("batch_size", rng.choice(profile.rows)),) + (
            (("in_features", rng.choice(profile.features)),)
        )
        if rank3:
            dims = (
                ("batch_size", rng.choice(profile.batch)),
                ("seq_len", rng.choice(profile.rows)),
            ) + dims[1:]
        return Shape(
            dims, (("in_features", dims[-1][1]), ("out_features", rng.choice(profile.features)))
        )
    cols = ("dim", rng.choice(profile.cols))
    if rank3:
        return Shape(
            (("batch_size", rng.choice(profile.batch)), ("seq_len", rng.choice(profile.rows)), cols)
        )
    return Shape((("batch_size", rng.choice(profile.rows)), cols))


def draw(rng: random.Random, config: DrawConfig) -> Graph:
    """One graph from ``rng`` (all randomness comes from it: same state, same graph)."""
    family = _weighted(rng, config.families)
    if family in LAYOUT_FAMILIES:
        return _draw_layout(rng, family, config)
    dtype = _weighted(rng, config.dtypes)
    guard: set[str] = set()
    if family == "elementwise":
        prologue = _pointwise(rng, rng.randint(1, config.max_pointwise), False, guard)
        core, epilogue = None, []
    else:
        core_kind = rng.choice(sorted(k for k, f in CORE_FAMILY.items() if f == family))
        core = Op(core_kind, None)
        budget = rng.randint(0 if family != "matmul" else 1, config.max_pointwise - 1)
        n_pro = 0 if family == "matmul" else rng.randint(0, budget)
        prologue = _pointwise(rng, n_pro, False, guard)
        if core_kind == "sum" and dtype != "float32" and guard:
            # a sum of grown values overflows half precision: draw the prologue again, tame
            prologue = _pointwise(rng, n_pro, False, set(), growing=False)
        epilogue = _pointwise(
            rng,
            budget - n_pro,
            core_kind in REDUCING,
            guard,
            growing=core_kind != "sum",
            previous=core_kind,
        )
    rank3 = rng.random() < config.rank3_share
    sizes = {
        kind: _shape(random.Random(rng.random()), profile, rank3, family == "matmul")
        for kind, profile in PROFILES.items()
    }
    return Graph(family, dtype, tuple(prologue), core, tuple(epilogue), sizes)


def tolerances(graph: Graph) -> tuple[float, float] | None:
    """Tolerances wider than the dtype defaults where a reference kernel legitimately differs:
    a half-precision linear layer accumulates in another order than torch's CPU kernel."""
    if graph.core is not None and graph.core.kind == "linear" and graph.dtype != "float32":
        return (2e-2, 2e-2) if graph.dtype == "float16" else (5e-2, 5e-2)
    return None
