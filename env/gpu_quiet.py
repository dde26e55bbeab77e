"""Whether the GPU runs any work but this process's, asked by the trusted side itself.

A paused sandbox launches nothing new, but kernels it queued before the pause still run, for as
long as they were written to run. A solution that leaves a long kernel queued as it reports its
timing would run it while the worker times the reference: the reference slows, the solution's
speed-up grows, and through the reference timing cache every later speed-up of the task too.
Nothing the sandbox says can rule that out; the GPU can. Without MPS, kernels of two CUDA
contexts never run at once: the GPU switches between contexts that have work, so a kernel of
ours waits while another context's kernel holds the GPU. ``QuietProbe.wait`` launches a
one-element kernel and waits for it, again and again, until nearly all of the last few came
back about as fast as the fastest this process ever saw (no other context's work was in the
way), or its deadline passes. Once every sandbox is paused, a quiet GPU stays quiet: nobody is
left to queue.

SM time is not all the GPU shares. Its copy engines are scheduled apart from its compute, so
another context's queued copies can stream through the GPU's memory while our kernels run,
slowing a memory-bound reference without delaying a one-element kernel. Each probe therefore
also reads a block larger than the L2 cache, timed on the GPU, and counts only when that read
came within ``READ_FACTOR`` of the fastest one: the memory's bandwidth is ours too.
"""

from __future__ import annotations

import time
from collections import deque

import torch

# A probe counts as unobstructed within this factor of the fastest one seen, or this many seconds
# over it (host jitter on a fast machine is a few microseconds; a context switch is not).
QUIET_FACTOR = 3.0
QUIET_SLACK_S = 30e-6
# The GPU is quiet when this many of the last QUIET_WINDOW probes were unobstructed: another
# context's work delays every probe, while a probe of ours held up on the host (another thread
# of this process taking the interpreter) is a rare outlier, not a reason to wait on.
QUIET_PROBES = 8
QUIET_WINDOW = 10
CALIBRATION_PROBES = 64
# The memory probe: a read of this many bytes (over twice the L2 of current GPUs, so it streams
# from memory), timed on the GPU (no host jitter), counts as unobstructed within this factor
# of the fastest read. A copy taking a fifth of the bandwidth slows it past that; one taking
# less slows a memory-bound reference less than the spread of its own timing.
READ_BYTES = 128 << 20
READ_FACTOR = 1.2


class QuietProbe:
    """One per evaluator and GPU; made before any sandbox has work there, so that its first
    fastest probe is an unobstructed one (later probes can only lower it). It holds
    ``READ_BYTES`` of the GPU's memory for its read."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._cell = torch.zeros(1, dtype=torch.int32, device=device)
        self._block = torch.zeros(READ_BYTES // 4, dtype=torch.float32, device=device)
        self._total = torch.zeros((), dtype=torch.float32, device=device)
        self._stream = torch.cuda.current_stream(device)  # the one the probes' kernels run on
        self._done = torch.cuda.Event()
        self._read_began = torch.cuda.Event(enable_timing=True)
        self._read_ended = torch.cuda.Event(enable_timing=True)
        self.fastest_s = self.fastest_read_s = float("inf")
        for _ in range(CALIBRATION_PROBES):
            self._probe(float("inf"))

    def _probe(self, deadline: float) -> bool | None:
        """Whether one probe was unobstructed (its one-element kernel about as fast as the
        fastest, and its read of memory too), or None at ``deadline``. The kernel is timed
        on the host, launch to done: time spent waiting for another context is what it looks
        for, and an event on the GPU would not see it. Polled rather than synchronised: a
        wait that let go of the interpreter would time this process's other threads too."""
        with torch.cuda.stream(self._stream):
            start = time.perf_counter()
            self._cell.add_(1)
            self._done.record(self._stream)
            if not _done_by(self._done, deadline):
                return None
            seconds = time.perf_counter() - start
            self._read_began.record(self._stream)
            torch.sum(self._block, dim=0, out=self._total)
            self._read_ended.record(self._stream)
        if not _done_by(self._read_ended, deadline):
            return None
        read_s = self._read_began.elapsed_time(self._read_ended) / 1e3
        self.fastest_s = min(self.fastest_s, seconds)
        self.fastest_read_s = min(self.fastest_read_s, read_s)
        return seconds <= self.limit_s() and read_s <= READ_FACTOR * self.fastest_read_s

    def limit_s(self) -> float:
        """The slowest a one-element kernel may be and still count as unobstructed."""
        return max(QUIET_FACTOR * self.fastest_s, self.fastest_s + QUIET_SLACK_S)

    def wait(self, timeout_s: float) -> float | None:
        """Seconds until the GPU was found quiet, or None when it was still busy at
        ``timeout_s``. The caller has paused every sandbox of the GPU and holds the lock on
        this process's own GPU work."""
        started = time.perf_counter()
        deadline = started + timeout_s
        recent: deque[bool] = deque(maxlen=QUIET_WINDOW)
        while sum(recent) < QUIET_PROBES:
            unobstructed = self._probe(deadline)
            if unobstructed is None:
                return None
            recent.append(unobstructed)
        return time.perf_counter() - started


def _done_by(event: torch.cuda.Event, deadline: float) -> bool:
    """Whether ``event`` was reached before ``deadline``, polled (see ``_probe``)."""
    while not event.query():
        if time.perf_counter() > deadline:
            return False
    return True
