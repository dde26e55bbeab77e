"""The reference timed side by side with the solution: its turns interleaved with the solution's
input sets in one exclusive window (``EvalConfig.cache_reference_timing`` off, trusted tasks).

A reference timed once and cached is compared with a solution timed later, under other clocks,
other neighbours and other memory placements: the speed-up then spreads with whatever changed
between the two. Interleaved (solution set 0, reference set 0, solution set 1, ...), the two
sides see the same conditions to within one set's time, and each side's figure is the mean of
its sets' medians as before. Every turn of the reference is timed as a cached one is: with the
solution's child paused and the GPU found quiet (``Evaluator._reference_alone``); a turn that
could not be timed alone ends the reference's timing, and the evaluation's timing is unused.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from kernelrl.env.gpu_claim import Sharing
from kernelrl.env.reference import PlacementTimer
from kernelrl.env.result import TimingStats
from kernelrl.env.timing import average


class InterleavedReference:
    """The reference's turns (eager, and torch.compile where asked) between the solution's
    input sets; ``count``: the most sets the solution may time on (it stops when its mean is
    known well enough, ``timing.placements_enough``, and the reference has a turn after each)."""

    def __init__(
        self,
        eager: PlacementTimer,
        compiled: PlacementTimer | None,
        alone: Callable[[], AbstractContextManager[Sharing]],
        count: int,
    ) -> None:
        self.timers = {"eager": eager, "compile": compiled}
        self.alone = alone
        self.count = count
        self.turns: dict[str, list[TimingStats]] = {"eager": [], "compile": []}
        self.taken = 0
        self.sharing = Sharing()
        self.seconds = 0.0

    def take_turn(self, index: int) -> None:
        """Time the reference's turn after the solution's input set ``index``."""
        if index != self.taken or index >= self.count:
            raise ValueError(
                f"the sandbox reported input set {index!r} timed out of turn "
                f"({self.taken} of {self.count} done)"
            )
        self.taken += 1
        if not self.sharing.alone:  # an earlier turn was not alone: nothing more to time
            return
        started = time.perf_counter()
        try:
            with self.alone() as sharing:
                self.sharing = self.sharing.merge(sharing)
                for kind, timer in self.timers.items():
                    if timer is not None and self.sharing.alone:
                        self.turns[kind].append(timer.time(index))
        finally:
            self.seconds += time.perf_counter() - started

    def stats(self) -> tuple[TimingStats | None, TimingStats | None, Sharing]:
        """Eager and torch.compile timings over every turn taken, and what a turn shared the GPU
        with; a timing is None where a turn was missed (not alone, or no turn at all)."""

        def over_turns(kind: str) -> TimingStats | None:
            runs = self.turns[kind]
            complete = self.taken > 0 and len(runs) == self.taken and self.sharing.alone
            return average(runs) if complete else None

        return over_turns("eager"), over_turns("compile"), self.sharing
