"""The lock that keeps one worker's trusted GPU work out of every measurement, and what it costs
each evaluation.

On a GPU every measurement (an exclusive window) takes the lock alone: nothing of the worker's
own runs on the GPU while a kernel is timed. The worker's own GPU work (reference outputs, the
reference's preparation, each compared chunk of an output) takes it shared: such steps exclude
every measurement but not each other, since none of them is timed. They had been serialised
too, and at KernelBench's published sizes the trusted steps then waited 56.5 s for the lock in
all against 32.4 s of holding it (benchmarks/README.md): one evaluation's comparison queued
behind another's preparation for no reason the measurement needed. A waiting measurement goes
first: once one asks, new trusted steps wait until it is done, so a stream of comparisons never
starves the windows. Each thread's trusted work records how long it waited for the lock and
how long it held it, so an evaluation can report both (``trusted_gpu_wait``,
``trusted_gpu_held``); held seconds of threads that shared the lock overlap.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator


class GpuLock:
    """``with lock:`` for a measurement (exclusive), ``with lock.trusted():`` for the worker's
    own GPU work (shared among trusted steps, accounted to the calling thread). Neither nests."""

    def __init__(self) -> None:
        self._state = threading.Condition()
        self._trusted_holders = 0
        self._measuring = False
        self._measurements_waiting = 0
        self._seconds = threading.local()

    def __enter__(self) -> bool:
        with self._state:
            self._measurements_waiting += 1
            try:
                self._state.wait_for(lambda: not self._measuring and self._trusted_holders == 0)
            finally:
                self._measurements_waiting -= 1
            self._measuring = True
        return True

    def __exit__(self, *exc: object) -> None:
        with self._state:
            self._measuring = False
            self._state.notify_all()

    @contextlib.contextmanager
    def trusted(self) -> Iterator[None]:
        asked = time.perf_counter()
        with self._state:
            self._state.wait_for(lambda: not self._measuring and self._measurements_waiting == 0)
            self._trusted_holders += 1
        held = time.perf_counter()
        try:
            yield
        finally:
            released = time.perf_counter()
            with self._state:
                self._trusted_holders -= 1
                if self._trusted_holders == 0:
                    self._state.notify_all()
            wait, hold = self._thread_seconds()
            self._seconds.value = (wait + held - asked, hold + released - held)

    def take_trusted_seconds(self) -> tuple[float, float]:
        """This thread's (waited, held) seconds of trusted work since it last asked."""
        seconds = self._thread_seconds()
        self._seconds.value = (0.0, 0.0)
        return seconds

    def _thread_seconds(self) -> tuple[float, float]:
        return getattr(self._seconds, "value", (0.0, 0.0))
