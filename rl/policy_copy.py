"""A copy of the policy that computes with its own weights only.

``copy.deepcopy`` copies modules and tensors but shares functions. TRL's ``GRPOTrainer`` patches
every policy's ``forward`` on the instance (``add_fused_lm_head``), and accelerate's mixed
precision wraps it once more (``convert_outputs_to_fp32``); both keep the forward they wrap in a
closure, as a method bound to the ORIGINAL model. A deep copy's ``forward`` therefore runs the
original: its weights, its training mode and its gradient checkpointing (which, in training mode,
drops the KV cache during generation). A "snapshot" made so is no snapshot: it samples from the
live policy while the optimizer writes to it. ``detached_copy`` rebuilds, on the copy, every
instance-level ``forward`` with each object of its closures replaced by that object's copy.
"""

from __future__ import annotations

import copy
import functools
import types
from typing import Any

import torch


def detached_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of ``model`` whose patched forwards call the copy, never ``model``."""
    memo: dict[int, Any] = {}
    clone = copy.deepcopy(model, memo)
    seen: dict[int, Any] = {}
    for module in clone.modules():
        forward = module.__dict__.get("forward")
        if forward is not None:
            module.forward = _rebound(forward, memo, seen)
    return clone


def _rebound(obj: Any, memo: dict[int, Any], seen: dict[int, Any]) -> Any:
    """``obj`` with everything the deep copy copied replaced by its copy: through bound
    methods, closures (and ``__wrapped__``), partials and callable wrapper objects. What holds
    nothing copied is returned as it is."""
    if id(obj) in memo:
        return memo[id(obj)]
    if id(obj) in seen:
        return seen[id(obj)]
    seen[id(obj)] = obj  # a cycle resolves to the original until rebuilt
    result = obj
    if isinstance(obj, types.MethodType):
        func, owner = _rebound(obj.__func__, memo, seen), _rebound(obj.__self__, memo, seen)
        if func is not obj.__func__ or owner is not obj.__self__:
            result = types.MethodType(func, owner)
    elif isinstance(obj, types.FunctionType):
        result = _rebuilt_function(obj, memo, seen)
    elif isinstance(obj, functools.partial):
        parts = [_rebound(p, memo, seen) for p in (obj.func, *obj.args)]
        keywords = {k: _rebound(v, memo, seen) for k, v in obj.keywords.items()}
        if any(a is not b for a, b in zip(parts, (obj.func, *obj.args), strict=True)) or any(
            keywords[k] is not v for k, v in obj.keywords.items()
        ):
            result = functools.partial(parts[0], *parts[1:], **keywords)
    elif (
        callable(obj) and not isinstance(obj, (type, torch.nn.Module)) and hasattr(obj, "__dict__")
    ):
        attributes = {k: _rebound(v, memo, seen) for k, v in vars(obj).items()}
        if any(attributes[k] is not v for k, v in vars(obj).items()):
            result = object.__new__(type(obj))  # not copy.copy: wrappers may refuse pickling
            vars(result).update(attributes)
    seen[id(obj)] = result
    return result


def _rebuilt_function(
    func: types.FunctionType, memo: dict[int, Any], seen: dict[int, Any]
) -> types.FunctionType:
    """``func`` with its closure cells and attributes (``__wrapped__``) rebound; ``func`` itself
    when none changes."""
    cells = []
    changed = False
    for cell in func.__closure__ or ():
        try:
            contents = cell.cell_contents
        except ValueError:  # an empty cell
            cells.append(cell)
            continue
        new = _rebound(contents, memo, seen)
        changed = changed or new is not contents
        cells.append(types.CellType(new) if new is not contents else cell)
    attributes = {k: _rebound(v, memo, seen) for k, v in vars(func).items()}
    changed = changed or any(attributes[k] is not v for k, v in vars(func).items())
    if not changed:
        return func
    rebuilt = types.FunctionType(
        func.__code__, func.__globals__, func.__name__, func.__defaults__, tuple(cells) or None
    )
    rebuilt.__kwdefaults__ = func.__kwdefaults__
    rebuilt.__qualname__ = func.__qualname__
    rebuilt.__doc__ = func.__doc__
    rebuilt.__module__ = func.__module__
    rebuilt.__annotations__ = func.__annotations__
    vars(rebuilt).update(attributes)
    return rebuilt
