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
came within ``READ_FACTOR`` of a quiet one: the memory's bandwidth is ours too.

The read is timed on the GPU, between two events, queued behind untimed reads of the same
block (its cushion): the host then queues it before the GPU reaches it, and the events time the
GPU's work alone, not how quickly a busy host issued it (an event recorded on an idle GPU is
reached at once, so without the cushion the read's time included the host's dispatch of the
read, and the interpreter lock another thread held meanwhile). A read the host queued too late
to be timed alone counts as obstructed. How many reads make a cushion is the host's property,
not the GPU's: calibration starts with ``CUSHION_READS`` and doubles them while most reads come
too late (a slower host, or launches slowed by a profiler in this process), so a host slower
than the one the constant was chosen on still calibrates. Probes are timed by a process that
also runs other threads: a launch held up on this host (the interpreter lock, preemption)
counts as obstructed too, the safe side; the tally says how many probes spent time off the CPU.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass, field

import torch

# A probe counts as unobstructed within this factor of the fastest one seen, or this many seconds
# over it (host jitter on a fast machine is a few microseconds; a context switch is not).
QUIET_FACTOR = 3.0
QUIET_SLACK_S = 30e-6
# The GPU is quiet when this many of the last QUIET_WINDOW probes were unobstructed: another
# context's work delays every probe, a rare outlier (a host hiccup) is not a reason to wait on.
QUIET_PROBES = 8
QUIET_WINDOW = 10
CALIBRATION_PROBES = 64
CALIBRATION_ATTEMPTS = 8  # probes tried per one needed, before calibration gives up
# The memory probe: a read of this many bytes (over twice the L2 of current GPUs, so it streams
# from memory), timed on the GPU, counts as unobstructed within this factor of a quiet read (the
# median of the calibration's). A copy taking a fifth of the bandwidth slows it past that; one
# taking less slows a memory-bound reference less than the spread of its own timing. The median,
# not the fastest: one read that found part of the block in the L2 would set a bar the others
# never reach.
READ_BYTES = 128 << 20
READ_FACTOR = 1.2
# Untimed reads queued before the timed one, long enough for the host to queue the rest; doubled
# by calibration, up to CUSHION_READS_MAX, while most of a round's reads come too late.
CUSHION_READS = 2
CUSHION_READS_MAX = 64


@dataclass
class ProbeTally:
    """What one wait's probes found: how many came back, how many of them spent time off the
    CPU on this host, how many launches were late, reads queued too late to be timed alone,
    and reads slow. A wait that times out says so: another context's kernels make launches
    late, its copies reads slow, and a busy host or interpreter shows as launches held off
    the CPU."""

    probes: int = 0
    held_off_cpu: int = 0
    queued_late: int = 0
    late_launches: int = 0
    slow_reads: int = 0
    launch_s: list[float] = field(default_factory=list)
    read_s: list[float] = field(default_factory=list)

    def describe(self, limit_s: float, read_limit_s: float) -> str:
        if not self.probes:
            return "no probe came back"
        parts = [
            f"{self.probes} probes",
            f"{self.held_off_cpu} held off the CPU on this host",
            f"{self.late_launches} launches over {limit_s * 1e6:.0f} us"
            + _median_us(self.launch_s),
            f"{self.queued_late} reads queued too late to time",
            f"{self.slow_reads} reads over {read_limit_s * 1e6:.0f} us" + _median_us(self.read_s),
        ]
        return ", ".join(parts)


class QuietProbe:
    """One per evaluator and GPU; made before any sandbox has work there, so that it is
    calibrated on a quiet GPU (its fastest launch can only be lowered later). It holds
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
        self.fastest_s = float("inf")
        self.quiet_read_s = float("inf")  # no read is slow until calibrated
        self.cushion_reads = CUSHION_READS
        self.tally = ProbeTally()  # the last wait's
        self._calibrate()

    def _calibrate(self) -> None:
        """The fastest launch and a quiet read, from probes until CALIBRATION_PROBES reads
        were timed (queued within their cushion), in rounds of CALIBRATION_PROBES probes; a
        round whose reads mostly came too late doubles the cushion."""
        for _ in range(CALIBRATION_ATTEMPTS):
            late_before = self.tally.queued_late
            for _ in range(CALIBRATION_PROBES):
                self._probe(float("inf"))
                if len(self.tally.read_s) == CALIBRATION_PROBES:
                    self.quiet_read_s = statistics.median(self.tally.read_s)
                    return
            if self.tally.queued_late - late_before > CALIBRATION_PROBES // 2:
                self.cushion_reads = min(2 * self.cushion_reads, CUSHION_READS_MAX)
        found = self.describe_last_wait()
        raise RuntimeError(
            f"the quiet-GPU probe could not be calibrated ({found}, cushion of "
            f"{self.cushion_reads} reads): a busy host or "
            "interpreter, or another context's work on the GPU"
        )

    def _probe(self, deadline: float) -> bool | None:
        """Whether one probe was unobstructed (its one-element kernel about as fast as the
        fastest, and its read of memory about as fast as a quiet one), or None at
        ``deadline``. The kernel is timed on the host, launch to done: time spent waiting for
        another context is what it looks for, and an event on the GPU would not see it.
        Polled rather than synchronised: a wait that let go of the interpreter would time
        this process's other threads too."""
        with torch.cuda.stream(self._stream):
            start, cpu_start = time.perf_counter(), time.thread_time()
            self._cell.add_(1)
            self._done.record(self._stream)
            if not _done_by(self._done, deadline):
                return None
            seconds = time.perf_counter() - start
            off_cpu = seconds - (time.thread_time() - cpu_start)
            queuing = time.perf_counter()
            for _ in range(self.cushion_reads):
                torch.sum(self._block, dim=0, out=self._total)
            self._read_began.record(self._stream)
            torch.sum(self._block, dim=0, out=self._total)
            self._read_ended.record(self._stream)
            queued_s = time.perf_counter() - queuing
        if not _done_by(self._read_ended, deadline):
            return None
        return self._judge(
            seconds, off_cpu, queued_s, self._read_began.elapsed_time(self._read_ended) / 1e3
        )

    def _judge(self, seconds: float, off_cpu: float, queued_s: float, read_s: float) -> bool:
        """A probe's verdict from its launch's seconds (``off_cpu`` of them not running on a
        CPU), the seconds the host took to queue the read, and the read's on the GPU. Every
        probe is judged, none is set aside: a probe the host held up counts as obstructed,
        since the GPU can also be what keeps a launch or a queued read waiting, and a wait
        that counted only the probes that ran smoothly would count only the moments another
        context let ours through."""
        tally = self.tally
        tally.probes += 1
        tally.held_off_cpu += off_cpu > QUIET_SLACK_S
        tally.launch_s.append(seconds)
        self.fastest_s = min(self.fastest_s, seconds)
        late = seconds > self.limit_s()
        tally.late_launches += late
        if queued_s > self.cushion_reads * min(read_s, self.quiet_read_s):
            tally.queued_late += 1
            return False
        tally.read_s.append(read_s)
        slow = read_s > self.read_limit_s()
        tally.slow_reads += slow
        return not (late or slow)

    def limit_s(self) -> float:
        """The slowest a one-element kernel may be and still count as unobstructed."""
        return max(QUIET_FACTOR * self.fastest_s, self.fastest_s + QUIET_SLACK_S)

    def read_limit_s(self) -> float:
        """The slowest a read of the block may be and still count as unobstructed."""
        return READ_FACTOR * self.quiet_read_s

    def wait(self, timeout_s: float) -> float | None:
        """Seconds until the GPU was found quiet, or None when it was not by ``timeout_s``
        (``describe_last_wait`` says what the probes found). The caller has paused every
        sandbox of the GPU and holds the lock on this process's own GPU work."""
        started = time.perf_counter()
        deadline = started + timeout_s
        self.tally = ProbeTally()
        recent: deque[bool] = deque(maxlen=QUIET_WINDOW)
        while sum(recent) < QUIET_PROBES:
            unobstructed = self._probe(deadline)
            if unobstructed is None:
                return None
            recent.append(unobstructed)
        return time.perf_counter() - started

    def describe_last_wait(self) -> str:
        """What the last wait's probes found (``ProbeTally``), for a wait that timed out."""
        return self.tally.describe(self.limit_s(), self.read_limit_s())


def _median_us(seconds: list[float]) -> str:
    return f" (median {statistics.median(seconds) * 1e6:.0f} us)" if seconds else ""


def _done_by(event: torch.cuda.Event, deadline: float) -> bool:
    """Whether ``event`` was reached before ``deadline``, polled (see ``_probe``)."""
    while not event.query():
        if time.perf_counter() > deadline:
            return False
    return True
