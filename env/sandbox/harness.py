"""What the trusted worker and the sandboxed child must do identically.

The reference outputs (trusted worker) and the solution outputs (sandboxed child) are computed
in different processes. They agree only if both build modules, models and inputs the same way
from the same seeds, so that procedure lives here, once.
"""

from __future__ import annotations

import linecache
import sys
import threading
import types
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from kernelrl.env.task import init_args

# torch's default generator is process-wide: two threads seeding it and drawing from it at the
# same time (a pool's slots computing references concurrently) would get each other's numbers.
_RNG_LOCK = threading.RLock()


def load_module(
    source: str, name: str, overrides: Mapping[str, Any] | None = None
) -> types.ModuleType:
    """Execute ``source`` as a fresh module registered under ``name``.

    Registration in ``sys.modules`` matters: Triton's JIT and ``inspect.getsource`` look kernels
    up through their module. ``overrides`` replace module globals (a task's size variant) after
    execution, which works because KernelBench's ``get_inputs`` reads its globals at call time.
    """
    module = types.ModuleType(name)
    module.__file__ = f"<{name}>"
    sys.modules[name] = module
    # Triton's JIT reads kernel source through inspect/linecache: serve it from memory.
    linecache.cache[module.__file__] = (
        len(source),
        None,
        source.splitlines(keepends=True),
        module.__file__,
    )
    code = compile(source, module.__file__, "exec")
    exec(code, module.__dict__)  # noqa: S102 - trusted task code, or untrusted code in the sandbox
    for key, value in (overrides or {}).items():
        if key not in module.__dict__:
            raise KeyError(f"size override {key!r} names no global of the task")
        module.__dict__[key] = value
    return module


def build_model(
    model_class: type, task: types.ModuleType, seed: int, device: torch.device
) -> torch.nn.Module:
    """Construct a model under ``seed`` so Model and ModelNew get identical parameters.

    Constructor arguments always come from the task's ``get_init_inputs``. The model stays in
    the mode its constructor leaves it in (training), because that is how KernelBench runs its
    references (under ``no_grad``, never ``.eval()``): a BatchNorm task is defined with the
    batch's statistics, and a solution written for KernelBench computes those. In eval mode
    the reference would use the initial running statistics instead, judge such solutions
    incorrect, and make some level-3 models all but constant in their inputs.
    """
    with _RNG_LOCK, torch.device(device):
        torch.manual_seed(seed)
        args, kwargs = init_args(task.get_init_inputs())
        torch.manual_seed(seed)
        model = model_class(*args, **kwargs)
    return model.to(device)


def make_inputs(module: types.ModuleType, seed: int, device: torch.device) -> list[Any]:
    """Fresh inputs for one check, created directly on ``device`` (no host round trip)."""
    with _RNG_LOCK, torch.device(device):
        seed_generators(seed, device)
        inputs = list(module.get_inputs())
    return [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]


# The profiler range around the harness's own work during timing and profiling (new input
# contents, the copies of kept outputs): its ops, and the GPU kernels they launch, are the
# harness's, not the solution's (``timed_run.aten_compute`` and ``profile_kernels`` leave them
# out).
HARNESS_RANGE = "kernelrl::harness"
# Timing input sets whose kept output (one of its timed calls, drawn after the fact) the trusted
# side compares with the reference; the memory plan (``admission``) counts a copy of each.
TIMED_OUTPUTS_CHECKED = 2


class TimedInputs:
    """The input sets a timing run calls the model on, one per placement, each given fresh
    contents before every timed call.

    Were the contents repeated, a kernel could keep its last output with a few of its inputs'
    values and replay it when they match: correct and fast on every timed call after the first.
    Contents of version ``v`` of placement ``p`` come from ``seed(p, v)``, so the trusted side
    can remake the inputs of any timed call whose output it checks. New contents are copied
    into the set's own tensors, so a placement keeps its memory (a memory-bound kernel's time
    depends on it); only when a second copy does not fit are the old tensors dropped first.

    The solution holds these tensors between refreshes and may have changed them (marked them
    as requiring grad, restrided them, swapped or freed their storage): a tensor is copied into
    only while it is still exactly as it was made, else it is replaced. Whatever the solution
    did, a refresh does not fail because of it.
    """

    def __init__(self, make: Callable[[int], list[Any]], first_seed: int, count: int) -> None:
        self.make = make
        self.first_seed = first_seed
        self.count = count
        self.sets = [make(first_seed)]
        for index in range(1, count):
            try:  # side by side, each on its own memory; fewer when the GPU has no room for
                # more: a large task is timed on fewer placements rather than failed
                self.sets.append(make(self.seed(index, 0)))
            except torch.cuda.OutOfMemoryError:
                break
        self.versions = [0] * len(self.sets)
        self.made = [[_as_made(value) for value in inputs] for inputs in self.sets]
        self.dropped: list[weakref.ref] = []

    def seed(self, placement: int, version: int) -> int:
        return timed_input_seed(self.first_seed, placement, version, self.count)

    def refresh(self, placement: int) -> None:
        self.versions[placement] += 1
        seed = self.seed(placement, self.versions[placement])
        with torch.no_grad(), torch.profiler.record_function(HARNESS_RANGE):
            try:
                fresh = self.make(seed)
            except torch.cuda.OutOfMemoryError:
                self.dropped = [weakref.ref(t) for t in tensors_in(self.sets[placement])]
                self.sets[placement] = []
                fresh = self.make(seed)
                self.sets[placement] = fresh
            else:
                self.sets[placement] = [
                    old.copy_(new)
                    if _unchanged(old, made) and _layout(old) == _layout(new)
                    else new
                    for old, new, made in zip(
                        self.sets[placement], fresh, self.made[placement], strict=True
                    )
                ]
            self.made[placement] = [_as_made(value) for value in self.sets[placement]]

    def dropped_held(self) -> bool:
        """Whether the model still holds contents a ``refresh`` without room for a second copy
        dropped: its own memory, not the harness's, when new contents then do not fit."""
        return any(ref() is not None for ref in self.dropped)


def _layout(value: Any) -> tuple[Any, ...] | None:
    """A plain tensor's layout and the size of its storage; ``None`` for anything a refresh
    never copies into (not exactly a tensor, or one that requires grad)."""
    if type(value) is not torch.Tensor or value.requires_grad or value.is_inference():
        return None
    return (
        tuple(value.shape),
        value.stride(),
        value.storage_offset(),
        value.dtype,
        value.device,
        value.untyped_storage().nbytes(),
    )


def _unchanged(value: Any, made: tuple[Any, ...] | None) -> bool:
    return made is not None and _as_made(value) == made


def _as_made(value: Any) -> tuple[Any, ...] | None:
    """``_layout`` and where the storage is: a tensor whose record changed since the harness
    made it was changed by the solution (restrided, storage swapped or resized)."""
    layout = _layout(value)
    return None if layout is None else (*layout, value.untyped_storage().data_ptr())


def seed_generators(seed: int, device: torch.device) -> None:
    """Seed the generators a task's ``get_inputs`` can draw from on ``device``: the CPU's and
    that GPU's. ``torch.manual_seed`` does the same for every backend torch knows, at a cost
    (~0.1 ms) that matters when every timed call gets fresh inputs."""
    torch.random.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.init()  # the generators exist once CUDA is initialised; a no-op after
        index = device.index if device.index is not None else torch.cuda.current_device()
        torch.cuda.default_generators[index].manual_seed(seed)


def timed_input_seed(first_seed: int, placement: int, version: int, placements: int) -> int:
    """The seed of placement ``placement``'s ``version``-th input contents in a timing run of
    ``placements`` placements (the number asked for, whether or not all fitted)."""
    return first_seed + placement + version * placements


def forward_call(
    model: torch.nn.Module, input_sets: Sequence[Sequence[Any]], index: int
) -> Callable[[], None]:
    """What timing repeats: one forward pass, without autograd, on whatever ``input_sets[index]``
    holds when it runs (``TimedInputs.refresh`` replaces it between calls)."""

    def call() -> None:
        with torch.no_grad():
            model(*input_sets[index])

    return call


def as_output_list(output: Any) -> list[Any]:
    """Outputs as a flat list: a tensor, or a tuple/list of tensors and scalars."""
    if isinstance(output, tuple | list):
        return list(output)
    return [output]


def tensors_in(values: Sequence[Any]) -> list[torch.Tensor]:
    return [v for v in values if isinstance(v, torch.Tensor)]


def storages_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when two tensors share any bytes of memory (views, aliases)."""
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    a_start = a.untyped_storage().data_ptr()
    b_start = b.untyped_storage().data_ptr()
    a_end = a_start + a.untyped_storage().nbytes()
    b_end = b_start + b.untyped_storage().nbytes()
    return a_start < b_end and b_start < a_end


def device_kind(device: torch.device | str) -> str:
    return torch.device(device).type
