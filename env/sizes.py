"""How much memory one forward call of a task needs, and CPU sizes for tasks published too big.

KernelBench's level-1 sizes create 6-16 GiB tensors: fine on an H100, fatal on the 2-core /
24 GB development machine where solutions run under the Triton interpreter. A task may declare
its CPU sizes (``KERNELRL = {"sizes": {"cpu": {...}}}``); when it does not and its footprint is
over the CPU budget, sizes are derived here by halving its module-level integer globals until it
fits, or a one-line TaskError says what to declare.

Everything is measured on the ``meta`` device: shapes and dtypes propagate, no memory is
allocated, so a 16 GiB task is measured in milliseconds. Task code runs in this process, as it
does in the trusted reference runner, so only a trusted task's (one the operator named) runs
here: every entry point taking a Task refuses an untrusted one (a client's), whose footprint its
sandboxed child measures with ``measure_module`` instead (env/sandboxed_reference.py).
"""

from __future__ import annotations

import ast
import itertools
import linecache
import os
import re
import sys
import threading
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from kernelrl.env.python_syntax import parse_python
from kernelrl.env.sandbox import harness
from kernelrl.env.task import Task, TaskError, init_args, require_trusted

MIB = 2**20
# Solutions run under the Triton interpreter on CPU: a ReLU over 16 MiB of inputs and outputs
# takes ~40 s to evaluate there, over 256 MiB it exceeds 300 s. 4 MiB keeps one evaluation in
# seconds, like the bundled tasks' declared CPU sizes (kilobytes).
DEFAULT_CPU_BUDGET_BYTES = 4 * MIB
BUDGET_ENV = "KERNELRL_CPU_BUDGET_MIB"  # overrides the default budget, in MiB

# Globals that set an operator's structure rather than its size: halving them changes what the
# task computes (a stride-1 conv is another task), so they are never scaled down.
_STRUCTURAL = re.compile(r"kernel|stride|pad|dilation|group|head|seed|pool|eps|axis", re.I)
_MAX_STEPS = 64
_counter = itertools.count()


@dataclass(frozen=True)
class Footprint:
    """Bytes of one forward call: inputs, parameters and buffers, outputs.

    ``exact`` is False when the forward cannot run on the meta device (data-dependent ops such
    as ``nonzero`` or ``.item()``): outputs are then estimated as inputs + parameters.
    Intermediate tensors are not counted, so the real peak is higher.
    """

    input_bytes: int
    param_bytes: int
    output_bytes: int
    total_bytes: int
    exact: bool


def cpu_budget_bytes() -> int:
    value = os.environ.get(BUDGET_ENV)
    return int(float(value) * MIB) if value else DEFAULT_CPU_BUDGET_BYTES


def estimate_footprint(task: Task, device_kind: str) -> Footprint:
    """Footprint at the sizes the task runs with on ``device_kind`` ('cpu' or 'cuda').

    For 'cuda' these are the published (or declared) sizes: the number for GPU admission by
    memory. For 'cpu' they include derived sizes, so this may raise the TaskError of
    :func:`cpu_size_overrides`.
    """
    require_trusted(task, "measuring its footprint in the worker")
    with _loaded(task.source, size_overrides(task, device_kind)) as module:
        return measure_module(module)


def size_overrides(task: Task, device_kind: str) -> dict[str, Any]:
    """The module-global overrides ``task`` runs with on 'cpu' or 'cuda': the declared ones,
    and on CPU, for a trusted task that declares none, sizes derived from its published ones
    when those exceed the CPU budget (``cpu_size_overrides``; runs the task module on the meta
    device in this process, once per task hash; a TaskError, one line, when none can be
    derived). An untrusted task never derives: its code runs only in a sandbox. GPU sizes are
    always the declared or published ones."""
    if device_kind in task.sizes or device_kind != "cpu" or not task.trusted:
        return task.size_overrides(device_kind)
    return cpu_size_overrides(task)


def cpu_size_overrides(task: Task, budget_bytes: int | None = None) -> dict[str, Any]:
    """The CPU overrides of a task that declares none: empty when it fits, else derived.

    Cached per task hash and budget, since size_overrides is asked for every evaluation.
    A task whose module cannot be measured at all (it does not load, or its inputs cannot be
    built on the meta device) gets no overrides: the reference runner then reports its own,
    more precise error.
    """
    require_trusted(task, "deriving its CPU sizes in the worker")
    budget = cpu_budget_bytes() if budget_bytes is None else budget_bytes
    key = (task.hash, budget)
    with _CACHE_LOCK:
        if key not in _CACHE:
            try:
                _CACHE[key] = ("ok", derive_cpu_sizes(task, budget))
            except TaskError as exc:
                _CACHE[key] = ("error", str(exc))
            except Exception:
                _CACHE[key] = ("ok", {})
        outcome, value = _CACHE[key]
    if outcome == "error":
        raise TaskError(value)
    return dict(value)


_CACHE: dict[tuple[str, int], tuple[str, Any]] = {}
_CACHE_LOCK = threading.Lock()


def derive_cpu_sizes(task: Task, budget_bytes: int | None = None) -> dict[str, Any]:
    """Overrides of the task's module globals that bring its footprint under ``budget_bytes``
    (default: :func:`cpu_budget_bytes`).

    Knobs are the module-level size assignments (see :func:`_knobs`), except structural ones
    (kernel size, stride, groups, heads...). Each step halves the knob, or the set of knobs of
    equal value, whose halving shrinks the footprint most (ties: the largest value, which keeps
    shapes balanced); halving keeps powers of two. The source is re-executed with the new value
    so that globals computed from it (``bias_shape = (out_channels, 1, 1)``) follow, and every
    changed plain global becomes an override. Each accepted step is verified the way the
    harness will run it: the original source with the overrides applied, measured on meta,
    forward included; a step that breaks shapes (divisibility, broadcasting) is dropped.

    Returns {} when the published sizes already fit, the declared ones when the task declares
    CPU sizes. Raises TaskError (one line) when they cannot be brought under budget.
    """
    require_trusted(task, "deriving its CPU sizes in the worker")
    budget = cpu_budget_bytes() if budget_bytes is None else budget_bytes
    if "cpu" in task.sizes:  # declared sizes are the author's word, whatever they cost
        return dict(task.sizes["cpu"])
    with _loaded(task.source, {}) as module:
        start = measure_module(module)
        if start.total_bytes <= budget:
            return {}
        values = _knobs(task.source, module)
        baseline = _plain_globals(module)
    overrides: dict[str, Any] = {}
    current = start
    dead: set[frozenset[Where]] = set()
    for _ in range(_MAX_STEPS):
        best = _best_step(task, values, dead, baseline, current)
        if best is None:
            break
        step, new_overrides, footprint = best
        if not _verified(task, new_overrides, footprint, current.exact):
            dead.add(step)
            continue
        values.update({where: _halved(values[where]) for where in step})
        overrides, current = new_overrides, footprint
        if current.total_bytes <= budget:
            return overrides
    names = sorted(n for n in baseline if type(baseline[n]) is int and not n.startswith("_"))
    raise TaskError(
        f"task {task.id}: one forward needs {_mib(start.total_bytes)} at its published sizes, "
        f"over the CPU budget of {_mib(budget)} ({BUDGET_ENV}), and halving its size globals "
        f"gets it only to {_mib(current.total_bytes)}; declare CPU sizes in the task: "
        'KERNELRL = {"sizes": {"cpu": {...}}} over its globals ' + ", ".join(names[:8])
    )


# ---------------------------------------------------------------------------- measuring
def measure_module(module: types.ModuleType) -> Footprint:
    """Build inputs and model and run forward, all on the meta device."""
    with torch.device("meta"), torch.no_grad():
        inputs = list(module.get_inputs())
        args, kwargs = init_args(module.get_init_inputs())
        model = module.Model(*args, **kwargs)
        input_bytes = sum(_nbytes(t) for t in _tensors(inputs))
        param_bytes = 0
        if isinstance(model, torch.nn.Module):
            param_bytes = sum(_nbytes(t) for t in model.parameters())
            param_bytes += sum(_nbytes(t) for t in model.buffers())
        try:
            outputs = model(*inputs)
        except Exception:  # data-dependent ops have no meta kernel: estimate
            guess = input_bytes + param_bytes
            return Footprint(input_bytes, param_bytes, guess, 2 * guess, exact=False)
    output_bytes = sum(_nbytes(t) for t in _tensors([outputs]))
    total = input_bytes + param_bytes + output_bytes
    return Footprint(input_bytes, param_bytes, output_bytes, total, exact=True)


def _tensors(values: Any) -> Iterator[torch.Tensor]:
    if isinstance(values, torch.Tensor):
        yield values
    elif isinstance(values, list | tuple):
        for value in values:
            yield from _tensors(value)
    elif isinstance(values, Mapping):
        for value in values.values():
            yield from _tensors(value)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class _loaded:
    """A task module executed on the meta device under a unique name, unregistered after."""

    def __init__(self, source: str, overrides: Mapping[str, Any]) -> None:
        self.source, self.overrides = source, overrides
        self.name = f"kernelrl_sizes_{next(_counter)}"

    def __enter__(self) -> types.ModuleType:
        try:
            with torch.device("meta"):  # module-level tensors, if any, cost nothing either
                return harness.load_module(self.source, self.name, self.overrides)
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc: object) -> None:
        sys.modules.pop(self.name, None)
        linecache.cache.pop(f"<{self.name}>", None)


# ---------------------------------------------------------------------------- deriving
# A knob is the value at (statement index, position in a tuple unpacking, or -1 for the whole).
Where = tuple[int, int]


def _knobs(source: str, module: types.ModuleType) -> dict[Where, Knob]:
    """Each module-level size assignment worth halving, and its value: an int
    (``dim = 4096``, ``N = 2048 * 2``), a tuple of ints (``input_shape = (4096,)``), an item of
    a tuple unpacking (``D, H, W = 16, 32, 32``); the names of a chained assignment
    (``height = width = 256``) are one knob."""
    knobs: dict[Where, Knob] = {}
    for index, node in enumerate(parse_python(source).body):
        if not isinstance(node, ast.Assign):
            continue
        if all(isinstance(t, ast.Name) for t in node.targets):
            names = [t.id for t in node.targets]
            if not any(_STRUCTURAL.search(n) for n in names) and "KERNELRL" not in names:
                _add_knob(knobs, (index, -1), module.__dict__.get(names[0]))
        elif (
            len(node.targets) == 1
            and isinstance(node.targets[0], ast.Tuple)
            and isinstance(node.value, ast.Tuple)
            and len(node.targets[0].elts) == len(node.value.elts)
        ):
            for position, target in enumerate(node.targets[0].elts):
                if isinstance(target, ast.Name) and not _STRUCTURAL.search(target.id):
                    _add_knob(knobs, (index, position), module.__dict__.get(target.id))
    return knobs


def _add_knob(knobs: dict[Where, Knob], where: Where, value: Any) -> None:
    is_int = type(value) is int
    is_shape = type(value) is tuple and value and all(type(v) is int for v in value)
    if (is_int or is_shape) and _size(value) >= 2:
        knobs[where] = value


Knob = int | tuple[int, ...]


def _size(value: Knob) -> int:
    return value if isinstance(value, int) else max(value)


def _halved(value: Knob) -> Knob:
    """Half the value; of a shape, half its largest entries (``(4096, 3)`` -> ``(2048, 3)``)."""
    if isinstance(value, int):
        return value // 2
    largest = max(value)
    return tuple(v // 2 if v == largest else v for v in value)


def _steps(values: Mapping[Where, Knob], dead: set[frozenset[Where]]) -> list[frozenset[Where]]:
    """Each knob alone, and each set of knobs of equal size together: ``batch_size = 4096``
    with ``input_shape = (4096,)`` or ``M = 4096`` with ``N = 4096`` often must stay equal."""
    live = {where: _size(value) for where, value in values.items() if _size(value) >= 2}
    steps = [frozenset([where]) for where in live]
    for size in set(live.values()):
        group = frozenset(where for where, s in live.items() if s == size)
        if len(group) > 1:
            steps.append(group)
    return [step for step in steps if step not in dead]


def _plain(value: Any) -> bool:
    if type(value) in (int, float, bool):
        return True
    return isinstance(value, tuple | list) and all(_plain(v) for v in value)


def _plain_globals(module: types.ModuleType) -> dict[str, Any]:
    return {
        name: value
        for name, value in module.__dict__.items()
        if not name.startswith("__") and _plain(value)
    }


def _with_values(source: str, values: Mapping[Where, Knob]) -> str:
    tree = parse_python(source)
    for (index, position), value in values.items():
        node = tree.body[index]
        old = node.value if position < 0 else node.value.elts[position]
        new = ast.copy_location(ast.Constant(value), old)
        if position < 0:
            node.value = new
        else:
            node.value.elts[position] = new
    return ast.unparse(tree)


def _best_step(
    task: Task,
    values: Mapping[Where, Knob],
    dead: set[frozenset[Where]],
    baseline: Mapping[str, Any],
    current: Footprint,
) -> tuple[frozenset[Where], dict[str, Any], Footprint] | None:
    """The next halving: of the largest knob whose halving shrinks the footprint by at least
    10%, or failing that the step that shrinks it most; None when nothing shrinks it.

    Largest first keeps shapes balanced: picking the biggest shrink instead collapses the
    spatial size of a valid 3x3 convolution (8x8 -> 4x4 shrinks its output 9-fold) long
    before its batch. The 10% floor skips knobs that hardly matter (a batch next to weights).
    """
    steps = sorted(
        _steps(values, dead),
        key=lambda step: (-max(_size(values[w]) for w in step), len(step), sorted(step)),
    )
    fallback = None
    for step in steps:
        trial = {**values, **{where: _halved(values[where]) for where in step}}
        try:
            with _loaded(_with_values(task.source, trial), {}) as module:
                footprint = measure_module(module)
                changed = {
                    name: value
                    for name, value in _plain_globals(module).items()
                    if name in baseline and baseline[name] != value
                }
        except Exception:  # inconsistent shapes at construction: this step cannot shrink
            dead.add(step)
            continue
        # Forward broke (shapes no longer agree), or the knob does not set a size: drop it.
        if footprint.exact != current.exact or footprint.total_bytes >= current.total_bytes:
            dead.add(step)
            continue
        if footprint.total_bytes <= 0.9 * current.total_bytes:
            return step, changed, footprint
        if fallback is None or footprint.total_bytes < fallback[2].total_bytes:
            fallback = (step, changed, footprint)
    return fallback


def _verified(task: Task, overrides: Mapping[str, Any], expected: Footprint, exact: bool) -> bool:
    """The overrides, applied as the harness applies them, give the measured footprint."""
    try:
        with _loaded(task.source, overrides) as module:
            footprint = measure_module(module)
    except Exception:
        return False
    return footprint.exact == exact and footprint.total_bytes == expected.total_bytes


def _mib(nbytes: int) -> str:
    if nbytes >= 2**30:
        return f"{nbytes / 2**30:.1f} GiB"
    return f"{nbytes / MIB:.1f} MiB"
