"""The sandbox's audit of a solution's calls: what it dispatched, what it launched, and
whether it left the harness as it found it.

Runs inside the sandboxed child, beside the solution: every defence here is evidence for the
trusted side, which decides the verdict (``dynamic_checks``), and each is itself watched
(``TamperGuard``; what it watches is the sandbox's to say: ``sandbox.guard``) so that switching
one off shows.
"""

from __future__ import annotations

import math
import re
import sys
import types
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from kernelrl.env.integrity import vocabulary
from kernelrl.env.integrity.failure import GLOBAL_STATE
from kernelrl.env.integrity.global_state import STATE_FOLLOWERS, torch_global_state

SCALAR_READ = "aten::_local_scalar_dense"  # float(t), int(t), t.item(): a value into Python
# Reads of each one-element parameter or buffer allowed per call (a scalar may be read in a
# few places of a forward).
READS_PER_SCALAR = 4
# The one-element parameters and buffers whose reads are allowed, at most: what a task needs
# (KernelBench's references have two at most). A model of thousands of them would otherwise
# carry a whole task's values into Python, a few per parameter.
MAX_SCALAR_PARAMETERS = 4


@dataclass(frozen=True)
class ScalarParameters:
    """The model's one-element parameters and buffers (KernelBench's
    ``self.constant = nn.Parameter(torch.tensor(c))``). Reading a tensor's values into Python is
    compute (what is computed from them no audit sees), except a few reads of these per call:
    that is how a solution hands a kernel a scalar, and a few values per call compute nothing."""

    pointers: frozenset[int] = frozenset()

    @classmethod
    def of(cls, model: torch.nn.Module) -> ScalarParameters:
        tensors = list(model.parameters()) + list(model.buffers())
        return cls(frozenset(t.data_ptr() for t in tensors if t.numel() == 1))

    @property
    def reads_per_call(self) -> int:
        """Reads allowed per call, all parameters together: bounded by what a task needs
        (``MAX_SCALAR_PARAMETERS``), however many one-element parameters the model has."""
        return READS_PER_SCALAR * min(len(self.pointers), MAX_SCALAR_PARAMETERS)


class ComputeSeen(BaseException):  # noqa: N818 - a signal, not an error of the solution's
    """Raised by an audit told to stop at the first compute op of a checked call: the verdict is
    already ``torch_fallback_runtime``, and a forward computing in plain Python over millions of
    values would otherwise run on until the timeout. A ``BaseException``, so that a solution's
    ``except Exception`` does not swallow it."""


class AtenAudit(TorchDispatchMode):
    """Every aten op a solution's call dispatches, judged by the vocabulary's allow-list.

    Compute ops (anything not allocation/view/copy/cast/pad) are recorded by name; copies count
    their bytes against the glue budget, except the copies Triton's own launcher makes (the
    interpreter moves arguments with ``copy_``). Two tallies are kept, one the solution could
    reach (``compute``/``glue_calls``) and one in a closure: they disagree if the visible one
    was reset.
    """

    def __init__(
        self,
        launches: LaunchCounter,
        scalars: ScalarParameters | None = None,
        stop_at_compute: bool = False,
    ) -> None:
        super().__init__()
        self.launches = launches
        self.stop_at_compute = stop_at_compute
        self.scalars = scalars or ScalarParameters()
        self.scalar_reads_left = self.scalars.reads_per_call
        self.compute: Counter[str] = Counter()
        self.glue_calls = 0
        self.copied_bytes = 0
        seen = [0]

        def note() -> None:
            seen[0] += 1

        self._note = note
        self._seen = lambda: seen[0]
        self.closing = False
        self.popped_early = False

    def __exit__(self, *exc: object) -> None:
        self.closing = True
        try:
            super().__exit__(*exc)
        finally:
            self.closing = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        name = func._schema.name
        self._note()
        kwargs = kwargs or {}
        if vocabulary.is_solution_op(name):
            out = self._run_solution_op(func, args, kwargs)
        else:
            out = func(*args, **kwargs)
        if vocabulary.is_glue_aten(name) or self._reads_own_scalar(name, args):
            self.glue_calls += 1
            if name in vocabulary.COPYING_ATEN_OPS and not self.launches.depth:
                self.copied_bytes += nbytes(out)
        else:
            self.compute[name] += 1
            if self.stop_at_compute:
                raise ComputeSeen(name)
        return out

    def new_call(self) -> None:
        """One audit watching several calls (spot audits): each call gets its scalar reads."""
        self.scalar_reads_left = self.scalars.reads_per_call

    def _reads_own_scalar(self, name: str, args: tuple) -> bool:
        if name != SCALAR_READ or self.scalar_reads_left <= 0 or not args:
            return False
        tensor = args[0]
        if not isinstance(tensor, torch.Tensor) or tensor.data_ptr() not in self.scalars.pointers:
            return False
        self.scalar_reads_left -= 1
        return True

    def _run_solution_op(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """An op the solution registered (``custom_op``, ``triton_op``) is its own code, so its
        body runs under this audit like the forward that called it: calling ``func`` here would
        run the body with the mode switched off, where torch compute would go unseen. The op is
        redispatched straight to its backend kernel (the body) with the audit pushed again, on
        the device the dispatcher would pick (CUDA if any argument is there). ``wrap_triton``
        launches its kernel directly meanwhile, as inside a ``triton_op``: under a dispatch mode
        it would go through a higher-order op that this mode has no rule for."""
        from torch._library.triton import set_wrap_triton_enabled

        leaves = pytree.tree_leaves((args, kwargs))
        on_cuda = any(
            (isinstance(a, torch.Tensor) and a.is_cuda)
            or (isinstance(a, torch.device) and a.type == "cuda")
            for a in leaves
        )
        key = torch._C.DispatchKey.CUDA if on_cuda else torch._C.DispatchKey.CPU
        with self, set_wrap_triton_enabled(False):
            return func.redispatch(torch._C.DispatchKeySet(key), *args, **kwargs)

    def on_top(self) -> bool:
        """Inside the audited block: this audit is the one and only active dispatch mode."""
        stack = _get_current_dispatch_mode_stack()
        return len(stack) == 1 and stack[0] is self

    def tampered(self) -> list[str]:
        problems = []
        if self._seen() != sum(self.compute.values()) + self.glue_calls:
            problems.append("the audit's op counts were changed")
        if self.popped_early:
            problems.append("the audit's dispatch mode was popped during a call")
        return problems


def guard_dispatch_stack() -> None:
    """Popping the dispatch-mode stack goes through a check: an audit popped by anything but
    its own exit (``_pop_mode_temporarily``, a direct ``torch._C`` pop) marks it tampered."""
    import torch.utils._python_dispatch as python_dispatch

    original = torch._C._pop_torch_dispatch_stack

    def checked_pop(*args: Any) -> Any:
        mode = original(*args)
        if isinstance(mode, AtenAudit) and not mode.closing:
            mode.popped_early = True
        return mode

    torch._C._pop_torch_dispatch_stack = checked_pop
    python_dispatch._pop_torch_dispatch_stack = checked_pop


def nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, tuple | list):
        return sum(nbytes(v) for v in value)
    return 0


class LaunchCounter:
    """Counts launches of the solution's own Triton kernels, on CPU and GPU alike.

    Installed on Triton's kernel classes before the solution is imported; only kernels whose
    Python function lives in the solution module are counted. ``depth`` is non-zero while one
    of them is being launched.
    """

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.depth = 0

    def install(self, solution_module: str) -> None:
        """Count launches of kernels defined in the module named ``solution_module``."""
        import triton.runtime.jit as jit

        classes = [jit.JITFunction]
        try:
            from triton.runtime.interpreter import InterpretedFunction

            classes.append(InterpretedFunction)
        except ImportError:
            pass
        for cls in classes:
            original = cls.run

            def counted_run(self, *args, grid, _original=original, **kwargs):
                owner = self.counts_owner
                if (
                    not kwargs.get("warmup", False)
                    and getattr(self.fn, "__module__", "") == solution_module
                ):
                    grid = owner.counting(self.fn.__name__, grid)
                owner.depth += 1
                try:
                    return _original(self, *args, grid=grid, **kwargs)
                finally:
                    owner.depth -= 1

            cls.run = counted_run
            cls.counts_owner = self

    def counting(self, name: str, grid: Any) -> Any:
        """The launch's grid, counted once Triton has its dimensions: a launch over an empty
        grid runs no program, so it is no launch of the solution's kernel."""
        if not callable(grid):
            self._count(name, grid)
            return grid

        def sized(meta: Any) -> Any:
            dims = grid(meta)
            self._count(name, dims)
            return dims

        return sized

    def _count(self, name: str, dims: Any) -> None:
        try:
            programs = math.prod(int(d) for d in dims)
        except (TypeError, ValueError):
            programs = 1  # a grid Triton itself will reject: the launch fails on its own
        if programs > 0:
            self.counts[name] += 1

    def total(self) -> int:
        return sum(self.counts.values())


class TamperGuard:
    """What the harness relies on, by identity, taken before the solution is loaded.

    After every call the same objects must be in the same places: a patched timer, event,
    socket method, dispatch hook, launch counter or harness function, a replaced module in
    ``sys.modules``, or a trace/profile hook is tampering. Only callables, classes and modules
    are watched (torch rebinds plain state values lazily); names added later are ignored.
    torch's process-wide state (``torch_global_state``) must also read as it did: its changes
    are reported as what they are (``GLOBAL_STATE``), not as tampering with the harness.
    """

    def __init__(self, owners: list[tuple[str, Any]], modules: list[str]) -> None:
        self._watched: list[tuple[str, Any, str, Any]] = []
        for label, owner in owners:
            for name, value in list(vars(owner).items()):
                if owner is torch and name in STATE_FOLLOWERS:
                    continue  # part of the state, compared as such
                if callable(value) or isinstance(value, types.ModuleType | type):
                    self._watched.append((label, owner, name, value))
        self._modules = {name: sys.modules.get(name) for name in modules}
        self._state = torch_global_state()

    def verify(self) -> list[str]:
        state = torch_global_state()
        changed = [
            f"{GLOBAL_STATE}: {name} {before!r} -> {state.get(name)!r}"
            for name, before in self._state.items()
            if state.get(name) != before
        ]
        changed += [
            f"{label}.{name}"
            for label, owner, name, value in self._watched
            if vars(owner).get(name) is not value
        ]
        changed += [
            f"sys.modules[{name!r}]"
            for name, module in self._modules.items()
            if sys.modules.get(name) is not module
        ]
        if sys.gettrace() is not None:
            changed.append("sys.settrace")
        if sys.getprofile() is not None:
            changed.append("sys.setprofile")
        if _get_current_dispatch_mode_stack():
            changed.append("a dispatch mode left active")
        return changed[:8]


# A GPU copy as CUPTI names it (``Memcpy DtoH (Device -> Pageable)``): its kind, and its size
# among the activity's metadata (``"bytes": 4``).
_COPY_KIND = re.compile(r"^Memcpy ([A-Z])to([A-Z])\b")
_COPY_BYTES = re.compile(r'"bytes"\s*:\s*(\d+)')


def host_copy(event: Any) -> dict[str, Any] | None:
    """A profiled GPU copy to or from host memory (``HtoD``, ``DtoH``, ``HtoH``...; not
    ``DtoD``) as ``{"name", "bytes", "us"}``, ``bytes`` ``None`` where the profiler's metadata
    does not say; ``None`` for anything else. Copies between the device and the host in a
    forward call move its work to host code (``host_compute``), but for a few scalars."""
    kind = _COPY_KIND.match(event.name())
    if kind is None or "H" not in kind.groups():
        return None
    try:
        size = _COPY_BYTES.search(event.metadata_json() or "")
    except (AttributeError, RuntimeError):  # a profiler build without the metadata
        size = None
    return {
        "name": event.name(),
        "bytes": int(size.group(1)) if size else None,
        "us": event.duration_ns() / 1e3,
    }
