"""An evaluation's compile companion (``sandbox.compiler``) seen from the worker: started with
the evaluation, checked on its own word before any solution code ran in it, handed to the child
with the solution, and retired with the child.

The check is what lets it run unpaused through other evaluations' measurements: its ``ready``
message, from our code alone, lists the GPU device files it can open, and a companion that can
open any (a host whose filesystem view fell back to the host's own tree) is never handed over.
"""

from __future__ import annotations

import socket
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from kernelrl.env.sandbox.child_process import Child, ChildDied
from kernelrl.env.sandbox.protocol import ProtocolError
from kernelrl.env.sandbox.spawn import spawn_companion

# When the solution is sent, how long a companion not yet ready is waited for (one started
# with the evaluation is ready long before, its message waiting on the channel).
START_S = 5.0


class Companion:
    """One evaluation's companion, from its start to its retirement; ``status`` says whether
    it was handed to the child, or why not (for the evaluation's record)."""

    def __init__(self, device: str, gpu_index: int | None, limits: dict[str, Any]) -> None:
        self.future: Future[Child] = spawn_companion(device, gpu_index)
        self.limits = limits
        self.status = "not reached: the solution was never sent"

    def channel(self) -> socket.socket | None:
        """Its channel, for the child, once it said it sees no GPU device; None otherwise."""
        deadline = time.monotonic() + START_S
        try:
            process = self.future.result(timeout=START_S)
            process.send({"type": "limits", "limits": self.limits})
            ready = process.receive(deadline)
        except (FutureTimeout, ChildDied, ProtocolError, OSError, RuntimeError) as exc:
            self.status = f"not started: {type(exc).__name__}: {exc}"[:300]
            return None
        if ready.get("type") != "ready":
            self.status = f"not started: it said {ready.get('type')!r}"[:300]
            return None
        if ready.get("gpu_devices") != []:
            self.status = f"refused: it can open GPU devices ({ready.get('gpu_devices')})"[:300]
            return None
        self.status = "handed to the child"
        return process.sock

    def retire(self, retire: Any, record: dict[str, Any]) -> None:
        """``retire(child)`` once it has started: at once, or when the spawner gets to it; its
        status goes into ``record`` (an evaluation's ``sandbox``), beside the child's report."""
        record["compile_ahead"] = {"companion": self.status, **record.get("compile_ahead", {})}

        def retired(future: Future[Child]) -> None:
            if not future.cancelled() and future.exception() is None:
                retire(future.result())

        self.future.add_done_callback(retired)


def child_report(report: Any) -> dict[str, Any]:
    """The counts and errors a child says its companion gave it (``CompileAhead.report``), as
    plain numbers and short strings, whatever the child sent."""
    if not isinstance(report, dict):
        return {}
    counts = {
        key: int(report[key])
        for key in ("compiled_ahead", "found", "compiled_here")
        if isinstance(report.get(key), int)
    }
    errors = report.get("errors")
    said = [str(error)[:300] for error in errors[:5]] if isinstance(errors, list) else []
    return {**counts, "errors": said}
