"""What the sandbox's harness relies on, watched by the audit's ``TamperGuard`` after every call."""

from __future__ import annotations

import socket
import sys
import time
import types
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kernelrl.env import compare, timing
from kernelrl.env.integrity import audit, vocabulary
from kernelrl.env.integrity.audit import AtenAudit, LaunchCounter, TamperGuard
from kernelrl.env.sandbox import harness, protocol


def harness_guard(sandbox: list[types.ModuleType]) -> TamperGuard:
    """The guard over everything the sandbox's harness relies on: timers, sockets, torch's and
    Triton's entry points, the audit, the modules shared with the trusted side, this module and
    ``sandbox``, the child's own modules (its entry module and those serving the job)."""
    import builtins

    import triton.runtime.jit as jit

    owners: list[tuple[str, Any]] = [
        ("builtins", builtins),
        ("time", time),
        ("socket.socket", socket.socket),
        ("torch", torch),
        ("torch.Tensor", torch.Tensor),
        ("torch.nn.Module", torch.nn.Module),
        ("torch.nn.functional", torch.nn.functional),
        ("torch.cuda", torch.cuda),
        ("torch.cuda.Event", torch.cuda.Event),
        ("torch.profiler", torch.profiler),
        ("torch.autograd.profiler", torch.autograd.profiler),
        ("TorchDispatchMode", TorchDispatchMode),
        ("torch._C", torch._C),
        ("AtenAudit", AtenAudit),
        ("LaunchCounter", LaunchCounter),
        ("triton.JITFunction", jit.JITFunction),
        ("harness", harness),
        ("timing", timing),
        ("protocol", protocol),
        ("compare", compare),
        ("vocabulary", vocabulary),
        ("audit", audit),
        ("sandbox.guard", sys.modules[__name__]),
    ]
    for module in sandbox:
        name = "child" if module.__name__ == "__main__" else module.__name__.rsplit(".", 1)[-1]
        owners.append((f"sandbox.{name}", module))
    # Named as imported, so that a module moved to another package stays watched.
    shared = [harness, timing, protocol, vocabulary, audit]
    modules = ["torch", "triton", "time", "socket", *(module.__name__ for module in shared)]
    return TamperGuard(owners, modules)
