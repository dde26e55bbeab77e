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
        torch.manual_seed(seed)
        inputs = list(module.get_inputs())
    return [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]


def timing_input_sets(
    module: types.ModuleType, first_seed: int, device: torch.device, count: int
) -> list[list[Any]]:
    """Up to ``count`` input sets for timing, allocated side by side so that each lands on its
    own memory; fewer when the GPU has no room for more: a large task is timed on fewer
    placements rather than failed by the harness's own allocations."""
    input_sets = [make_inputs(module, first_seed, device)]
    for index in range(1, count):
        try:
            input_sets.append(make_inputs(module, first_seed + index, device))
        except torch.cuda.OutOfMemoryError:
            break
    return input_sets


def forward_call(model: torch.nn.Module, inputs: Sequence[Any]) -> Callable[[], None]:
    """What timing repeats: one forward pass on ``inputs``, without autograd."""

    def call() -> None:
        with torch.no_grad():
            model(*inputs)

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
