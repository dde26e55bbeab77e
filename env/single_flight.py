"""One producer at a time for a thing many threads may find missing at once.

Evaluations of one task run side by side (a group's samples, a batch taken longest-first), and
each finds the task's reference timing missing from the cache until the first of them has timed
it. Without a claim every one of them would prepare the reference (its model, its input sets,
torch.compile's compile: seconds under the lock every trusted GPU step takes), and those whose
windows came first would time it again in their own exclusive windows. With one, the first evaluation times it and the
others wait for it outside every lock, then find it cached. Only on a GPU: on a CPU neither the
preparation nor the timing holds anything the other evaluations need, and a waiting twin would
only be slower (measured: docs/decisions.md).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Collection, Iterator


class SingleFlight:
    """Keys some thread is producing now."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._claimed: set[str] = set()

    @contextlib.contextmanager
    def claim(self, keys: Collection[str], wait_s: float) -> Iterator[None]:
        """Held while the caller produces ``keys``. Waits first, up to ``wait_s``, while another
        thread holds any of them; past that, the caller goes on beside it (a producer that
        hangs delays the others once, never for good). Whatever the holder did, its release
        wakes the waiters, who look again for what they need."""
        wanted = set(keys)
        deadline = time.monotonic() + wait_s
        with self._changed:
            while wanted & self._claimed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
            mine = wanted - self._claimed
            self._claimed |= mine
        try:
            yield
        finally:
            with self._changed:
                self._claimed -= mine
                self._changed.notify_all()
