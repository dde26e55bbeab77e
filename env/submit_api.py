"""``evaluate`` and ``aevaluate`` derived from ``submit``, for the pools whose one primitive is
``submit(tasks, solutions, timeout_s) -> futures`` (RayPool, CachedPool, ServiceClient)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from kernelrl.env.result import EvalResult
from kernelrl.env.task import Task


class EvaluateFromSubmit:
    def evaluate(
        self, tasks: Sequence[Task], solutions: Sequence[str], timeout_s: float | None = None
    ) -> list[EvalResult]:
        """Blocks until every result is in; results in input order."""
        return [future.result() for future in self.submit(tasks, solutions, timeout_s)]  # type: ignore[attr-defined]

    async def aevaluate(
        self, tasks: Sequence[Task], solutions: Sequence[str], timeout_s: float | None = None
    ) -> list[EvalResult]:
        """The same without blocking the event loop (``submit`` may block on backpressure)."""
        futures = await asyncio.to_thread(self.submit, tasks, solutions, timeout_s)  # type: ignore[attr-defined]
        return list(await asyncio.gather(*(asyncio.wrap_future(f) for f in futures)))
