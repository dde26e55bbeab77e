"""torch's process-wide state: what a solution may not change, named as a class.

The sandbox makes each call's inputs (the task's ``get_inputs``) and reads its outputs in the
solution's own process, under torch's defaults (dtype, device), its backend flags
(``allow_tf32``...), deterministic algorithms and denormal flushing. The static check
``global_state`` refuses every name that changes them (``global_state_change``); the sandbox's
guard reads them before the solution is loaded and after every call (``torch_global_state``),
and the trusted side says a difference as ``global_state``.
"""

from __future__ import annotations

import functools
import inspect
import types
import warnings
from typing import Any

# The state's setters are named so (``set_*``, ``use_*``) in torch and each of its submodules,
# and ``torch.backends`` is made of its flags; only these setters change nothing a call or the
# sandbox computes.
STATE_SETTER_PREFIXES = ("set_", "use_")
STATE_MODULES = ("torch.backends",)
HARMLESS_STATE_SETTERS = frozenset(["set_printoptions", "set_grad_enabled"])
# Names of ``torch`` that torch itself rebinds with its state (``set_default_dtype`` makes
# ``torch.Storage`` the new dtype's storage class): they change with it, as part of it.
STATE_FOLLOWERS = frozenset(["Storage"])


@functools.cache
def global_state_change(qualified: str | None) -> str | None:
    """The part of ``qualified`` that changes torch's process-wide state
    (``torch.set_default_dtype``, ``torch.backends.cudnn``), read on the real objects: a setter
    of a module (not a tensor's ``set_``), or anything under ``torch.backends``."""
    import importlib

    if not qualified or qualified.split(".")[0] != "torch":
        return None
    if any(qualified == m or qualified.startswith(m + ".") for m in STATE_MODULES):
        return qualified
    parts = qualified.split(".")
    obj: Any = importlib.import_module("torch")
    for index, part in enumerate(parts[1:], 1):
        setter = part.lstrip("_").startswith(STATE_SETTER_PREFIXES)
        if isinstance(obj, types.ModuleType) and setter and part not in HARMLESS_STATE_SETTERS:
            return ".".join(parts[: index + 1])
        try:
            obj = getattr(obj, part)
        except AttributeError:
            try:
                obj = importlib.import_module(".".join(parts[: index + 1]))
            except ImportError:
                return None
    return None


def torch_global_state() -> dict[str, Any]:
    """torch's process-wide settings that change what later work in this process computes: the
    default dtype and device (the inputs the harness makes from the task's ``get_inputs``),
    deterministic algorithms, float32 matmul precision, denormal flushing, and every flag of
    ``torch.backends`` (read off its modules, so a flag torch adds is watched too)."""
    import torch

    state: dict[str, Any] = {
        "default dtype": torch.get_default_dtype(),
        "default storage": torch.Storage,
        "default device": str(torch.get_default_device()),
        "deterministic algorithms": (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        ),
        "deterministic debug mode": torch.get_deterministic_debug_mode(),
        "float32 matmul precision": torch.get_float32_matmul_precision(),
        "denormals flushed": _flushes_denormals(),
    }
    with warnings.catch_warnings():  # some flags' getters warn that they are deprecated
        warnings.simplefilter("ignore")
        for name, module in sorted(vars(torch.backends).items()):
            if isinstance(module, types.ModuleType) and not name.startswith("_"):
                _read_flags(f"torch.backends.{name}", module, state, depth=1)
        _read_flags("torch.backends.cuda.matmul", torch.backends.cuda.matmul, state, depth=0)
    return state


# ``torch.backends.cuda.matmul`` answers these through ``__getattr__``, so ``dir`` misses them.
_MATMUL_FLAGS = (
    "allow_tf32",
    "allow_fp16_reduced_precision_reduction",
    "allow_bf16_reduced_precision_reduction",
    "allow_fp16_accumulation",
    "fp32_precision",
)


def _read_flags(label: str, owner: Any, state: dict[str, Any], depth: int) -> None:
    """Scalar attributes of a backend (``torch.backends.cudnn.allow_tf32``), the scalar
    attributes of its settings objects (``cudnn.conv.fp32_precision``) and its ``*_enabled``
    getters (``flash_sdp_enabled()``). Caches and availability are left out: they are not
    settings (a cache's size grows with use; a library's availability is found lazily)."""
    names = {n for n in (*dir(owner), *dir(type(owner))) if not n.startswith("_")}
    if label.endswith(".matmul"):
        names.update(_MATMUL_FLAGS)
    for name in sorted(names):
        if "cache" in name or "available" in name:
            continue
        try:
            value = getattr(owner, name)
            if callable(value) and name.endswith("_enabled") and _takes_nothing(value):
                value = value()
        except Exception:  # a flag this build does not have
            continue
        if isinstance(value, bool | int | float | str):
            state[f"{label}.{name}"] = value
        elif depth > 0 and not (callable(value) or isinstance(value, types.ModuleType)):
            _read_flags(f"{label}.{name}", value, state, depth - 1)


def _takes_nothing(fn: Any) -> bool:
    try:
        return not any(
            p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            for p in inspect.signature(fn).parameters.values()
        )
    except (TypeError, ValueError):
        return False


def _flushes_denormals() -> bool:
    """Whether the CPU flushes denormals (``torch.set_flush_denormal``, which has no getter):
    a denormal float32 times one reads back as zero."""
    import torch

    tiny = torch.full((1,), 1e-40, dtype=torch.float32, device="cpu")
    return bool(torch.mul(tiny, 1.0)[0] == 0)
