"""The lock that serialises one worker's GPU work, and what it costs each evaluation.

On a GPU every measurement (an exclusive window) and every piece of the worker's own GPU work
(reference outputs, the reference's preparation, each compared chunk of an output) takes one
lock, so that trusted work never runs during another evaluation's measurement. At KernelBench's
published sizes the windows and preparations alone held it for over half the wall. Each
thread's trusted work records how long it waited for the lock and how long it held it, so an
evaluation can report both (``trusted_gpu_wait``, ``trusted_gpu_held``): how much of a
comparison is waiting and how much is work, and, the held seconds summed over a run beside the
exclusive windows, how much of the wall the lock was taken. Letting trusted steps share the
lock (measurements still alone) was measured and did not pay: their waits halved, but the
steps, now side by side on one GPU, took as much longer (docs/decisions.md).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator


class GpuLock:
    """A ``threading.Lock`` (``with lock:`` for a measurement) with a ``trusted()`` context for
    the worker's own GPU work that accounts its wait and hold to the calling thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds = threading.local()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    @contextlib.contextmanager
    def trusted(self) -> Iterator[None]:
        asked = time.perf_counter()
        with self._lock:
            held = time.perf_counter()
            try:
                yield
            finally:
                released = time.perf_counter()
                wait, hold = self._thread_seconds()
                self._seconds.value = (wait + held - asked, hold + released - held)

    def take_trusted_seconds(self) -> tuple[float, float]:
        """This thread's (waited, held) seconds of trusted work since it last asked."""
        seconds = self._thread_seconds()
        self._seconds.value = (0.0, 0.0)
        return seconds

    def _thread_seconds(self) -> tuple[float, float]:
        return getattr(self._seconds, "value", (0.0, 0.0))
