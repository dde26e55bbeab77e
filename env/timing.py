"""Kernel timing: one procedure for the reference and the solution, so speedups are fair.

GPU: warm-up, L2 flush before every repetition, CUDA events around each call, repetitions
until the median's relative standard error reaches a target or the time budget runs out; all
of it on each of several input sets, allocated side by side and timed one after another, and
their medians averaged: a memory-bound kernel's time depends on where in physical GPU memory
its buffers land (measurements: docs/decisions.md). Before every timed call its input set gets
fresh contents (``harness.TimedInputs``): a result a kernel stored and keyed on its inputs'
values never answers a timed call. Right after every call, outside its timed span, ``after_call``
runs (the sandbox copies the output it keeps of a timed call there, stream-ordered after the
call's end event): what is checked of a timed call is what existed when its span ended.
CPU (Triton interpreter): wall-clock repetitions, reported but flagged as not meaningful.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

import torch

from kernelrl.env.result import TimingStats

L2_FLUSH_BYTES = 256 * 1024 * 1024  # larger than the L2 of any current GPU (H100: 50 MB)
L2_FLUSHES = ("read", "write", "none")
# Raised when the procedure changes in a way its options do not name (how a flush reads, say),
# so that timings cached under the old one are taken again.
PROCEDURE = 2


@dataclass(frozen=True)
class TimingConfig:
    warmup_ms: float = 25.0  # before the first placement: clocks up, caches and allocator warm
    # Before each later placement, which follows the one before without a gap: the GPU is already
    # at clock, so only the new input set's first touches remain to warm.
    placement_warmup_ms: float = 2.0
    # Timed calls per placement before its error target may stop it: one batch. Thirty held
    # every evaluation's exclusive window, and every other child paused through it, 0.09 s
    # longer for speed-ups that moved less than runs of one setting did (docs/decisions.md).
    min_reps: int = 10
    # A placement whose timed calls add up to this many milliseconds may stop before min_reps,
    # once its error target is met (0: never), never before one batch: what a min_reps above
    # one batch keeps from a long kernel, whose median is steady in few calls (docs/decisions.md).
    enough_timed_ms: float = 50.0
    max_reps: int = 2000
    target_rel_err: float = 0.005
    budget_s: float = 1.0
    # How L2 is emptied before every repetition: "read" sums a buffer larger than L2, which
    # writes back what earlier calls left dirty during the flush and leaves only clean lines;
    # "write" zeroes it (Triton's do_bench), leaving L2 full of dirty lines that the timed
    # call then pays to write back; "none" keeps L2 warm.
    l2_flush: str = "read"
    batch: int = 10  # repetitions recorded between two host synchronisations
    placements: int = 4  # GPU: input sets, each its own allocation, timed one by one
    # More input sets, up to this many in all, while the mean of their medians is known to worse
    # than ``placements_rel_err`` and ``budget_s`` is not spent (``placements_enough``): a short
    # memory-bound kernel's sets lie 3-8% apart, and four left its speed-up spreading 1.04-1.06
    # between evaluations where sixteen held it within 1.02; a kernel whose sets agree stops at
    # ``placements`` (docs/decisions.md, "As many input sets as the mean needs"). The memory plan
    # may allow fewer (``fitted``).
    most_placements: int = 16
    placements_rel_err: float = 0.005
    fresh_inputs: bool = True  # new input contents before every timed call (``prepare``)
    # GPU: the solution's child gives up its context's local memory (spilled registers, stack)
    # and takes it anew elsewhere before each input set (``sandbox.local_memory``), so a
    # spilling kernel's time draws per set, not once per process; only where the solution's
    # first call needed local memory (docs/decisions.md, "A spilling kernel's local memory is
    # moved where its first call needed it").
    move_local_memory: bool = True
    cpu_min_reps: int = 3
    cpu_budget_s: float = 0.0  # interpreter timings mean nothing: a few reps suffice

    def __post_init__(self) -> None:
        if self.l2_flush not in L2_FLUSHES:
            raise ValueError(
                f"l2_flush must be one of {', '.join(L2_FLUSHES)}, not {self.l2_flush!r}"
            )
        if not 1 <= self.placements <= self.most_placements:
            raise ValueError(
                f"placements ({self.placements}) must be at least 1 and at most"
                f" most_placements ({self.most_placements})"
            )

    def settings(self) -> dict[str, object]:
        """Everything a timing depends on: the options and the procedure's version, which names
        a change the options do not (how L2 is flushed, say)."""
        return {**asdict(self), "procedure": PROCEDURE}

    def fingerprint(self) -> str:
        """Names the procedure in cache keys: a timing taken another way is not reused."""
        text = json.dumps(self.settings(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass
class TimingSteps:
    """Where a timing run's wall time went, summed over its placements. The exclusive window a
    solution is timed in holds all of it: what is not the timed calls themselves is what a
    shorter window would have to cut."""

    setup_s: float = 0.0  # first calls and the estimate of one (GPU: the L2 flush buffer too)
    warmup_s: float = 0.0
    reps_s: float = 0.0  # timed repetitions, queued and synchronised, batch by batch
    hold_s: float = 0.0  # of those, the GPU's holds queued before each call (as sized)
    between_s: float = 0.0  # between batches (``between_batches``: spot audits)
    host_call_s: float = 0.0  # the host's time for one call and its refresh (largest placement)

    def phases(self) -> dict[str, float]:
        """As an evaluation's phases: ``timing_setup``, ``timing_warmup``, ..."""
        return {f"timing_{key.removesuffix('_s')}": value for key, value in asdict(self).items()}


def summarize(samples_ms: list[float]) -> TimingStats:
    ordered = sorted(samples_ms)
    n = len(ordered)
    q = statistics.quantiles(ordered, n=4, method="inclusive") if n >= 2 else [ordered[0]] * 3
    median = statistics.median(ordered)
    # Standard error of the median from a robust sigma (IQR / 1.349), times sqrt(pi/2).
    sigma = (q[2] - q[0]) / 1.349
    rel_err = 1.2533 * sigma / math.sqrt(n) / median if median > 0 else 0.0
    return TimingStats(
        median_ms=median,
        p25_ms=q[0],
        p75_ms=q[2],
        min_ms=ordered[0],
        max_ms=ordered[-1],
        reps=n,
        rel_err=rel_err,
    )


# Fresh inputs cost the host more per call than many kernels take on the GPU, which would then
# wait for each launch with the start event already recorded, and time the host's latency.
# A spin on the GPU, queued before the refresh and longer than the host's time for one call,
# keeps the GPU behind the host, so each call's kernels are queued before its start event runs.
# (Queued after the flush and sized to the call's launch alone, it timed small kernels up to 10%
# apart from this one on an H200, for no rate measurably gained: docs/decisions.md.)
HOLD_FACTOR = 1.5
HOLD_MARGIN_US = 20.0
HOLD_MAX_US = 5000.0


def _nothing() -> None:
    pass


@functools.cache
def _sleep_cycles_per_us() -> float:
    """GPU clock cycles per microsecond of ``torch.cuda._sleep``, measured once per process."""
    torch.cuda._sleep(1000)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    torch.cuda._sleep(1_000_000)
    end.record()
    end.synchronize()
    return 1_000_000 / max(begin.elapsed_time(end) * 1e3, 1.0)


def _l2_flush(mode: str) -> Callable[[], None]:
    if mode == "none":
        return _nothing
    buffer = torch.ones(L2_FLUSH_BYTES // 4, dtype=torch.float32, device="cuda")
    if mode == "write":
        return buffer.zero_
    # A float sum reads at the memory's bandwidth; an int32 one accumulating in int64 took 0.36 ms
    # of every repetition on an H200 (docs/decisions.md), half of a small kernel's.
    total = torch.empty((), dtype=torch.float32, device="cuda")
    return lambda: torch.sum(buffer, dim=0, out=total)


def time_cuda(
    fn: Callable[[], object],
    config: TimingConfig = TimingConfig(),
    between_batches: Callable[[], None] | None = None,
    prepare: Callable[[], None] | None = None,
    after_call: Callable[[], None] | None = None,
    steps: TimingSteps | None = None,
) -> TimingStats:
    """``between_batches`` runs after each batch's synchronisation, ``prepare`` before every
    call and ``after_call`` right after every call (after its end event is recorded), warm-up
    included, all outside every timed span (the L2 flush comes after ``prepare``): no call can
    tell a warm-up from a measured one by its inputs. ``steps`` adds up where the time went."""
    collecting = gc.isenabled()
    gc.disable()  # a collection while the GPU waits for the next launch would be timed
    try:
        return _time_cuda(
            fn,
            config,
            between_batches,
            prepare or _nothing,
            after_call or _nothing,
            steps if steps is not None else TimingSteps(),
        )
    finally:
        if collecting:
            gc.enable()


def _time_cuda(
    fn: Callable[[], object],
    config: TimingConfig,
    between_batches: Callable[[], None] | None,
    prepare: Callable[[], None],
    after_call: Callable[[], None],
    steps: TimingSteps,
) -> TimingStats:
    started = time.perf_counter()
    flush = _l2_flush(config.l2_flush)
    prepare()
    fn()
    after_call()
    prepare()
    torch.cuda.synchronize()
    # Warm-up for warmup_ms, sized from a first estimate of one call.
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    estimate_ms = max((time.perf_counter() - start) * 1e3, 1e-3)
    after_call()
    warming = time.perf_counter()
    steps.setup_s += warming - started
    host_s = _warm_up(
        fn, prepare, after_call, min(max(int(config.warmup_ms / estimate_ms), 1), 100)
    )
    hold_us = 0.0
    if prepare is not _nothing:
        hold_us = min(HOLD_FACTOR * statistics.median(host_s) * 1e6 + HOLD_MARGIN_US, HOLD_MAX_US)
    hold_cycles = int(hold_us * _sleep_cycles_per_us()) if hold_us else 0
    steps.host_call_s = max(steps.host_call_s, statistics.median(host_s))

    samples: list[float] = []
    batch_started = time.perf_counter()
    steps.warmup_s += batch_started - warming
    deadline = batch_started + config.budget_s
    while len(samples) < config.max_reps:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(config.batch)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(config.batch)]
        for begin, end in zip(starts, ends, strict=True):
            if hold_cycles:
                torch.cuda._sleep(hold_cycles)
            prepare()
            flush()
            begin.record()
            fn()
            end.record()
            after_call()
        torch.cuda.synchronize()
        samples.extend(b.elapsed_time(e) for b, e in zip(starts, ends, strict=True))
        between_started = time.perf_counter()
        steps.reps_s += between_started - batch_started
        steps.hold_s += config.batch * hold_us / 1e6
        if between_batches is not None:
            between_batches()
            torch.cuda.synchronize()
        batch_started = time.perf_counter()
        steps.between_s += batch_started - between_started
        if _enough(samples, config) and (
            summarize(samples).rel_err <= config.target_rel_err or batch_started > deadline
        ):
            break
    return summarize(samples)


def _enough(samples: list[float], config: TimingConfig) -> bool:
    """Enough timed calls to stop once the error target is met: ``min_reps``, or timed calls
    adding up to ``enough_timed_ms``."""
    if len(samples) >= config.min_reps:
        return True
    return 0 < config.enough_timed_ms <= sum(samples)


def _warm_up(
    fn: Callable[[], object],
    prepare: Callable[[], None],
    after_call: Callable[[], None],
    calls: int,
) -> list[float]:
    """``calls`` untimed calls; the host's time for each call with its refresh (what the
    GPU's hold is sized from)."""
    host_s = []
    for _ in range(calls):
        start = time.perf_counter()
        prepare()
        fn()
        host_s.append(time.perf_counter() - start)
        after_call()
    torch.cuda.synchronize()
    return host_s


def time_cpu(
    fn: Callable[[], object],
    config: TimingConfig = TimingConfig(),
    between_batches: Callable[[], None] | None = None,
    prepare: Callable[[], None] | None = None,
    after_call: Callable[[], None] | None = None,
    steps: TimingSteps | None = None,
) -> TimingStats:
    """``between_batches`` runs between repetitions, ``prepare`` before every call and
    ``after_call`` right after it, the untimed first one included, outside the timed spans;
    ``steps`` adds up where the time went (no warm-up, no hold)."""
    prepare, after_call = prepare or _nothing, after_call or _nothing
    steps = steps if steps is not None else TimingSteps()
    started = time.perf_counter()
    prepare()
    fn()
    after_call()
    samples: list[float] = []
    host_s: list[float] = []
    rep_started = time.perf_counter()
    steps.setup_s += rep_started - started
    deadline = rep_started + config.cpu_budget_s
    while len(samples) < config.cpu_min_reps or (
        time.perf_counter() < deadline and len(samples) < config.max_reps
    ):
        prepare()
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
        after_call()
        between_started = time.perf_counter()
        host_s.append(between_started - rep_started)
        if between_batches is not None:
            between_batches()
        rep_started = time.perf_counter()
        steps.between_s += rep_started - between_started
    steps.reps_s += sum(host_s)
    steps.host_call_s = max(steps.host_call_s, statistics.median(host_s))
    return summarize(samples)


def placements(device: torch.device, config: TimingConfig) -> int:
    """How many input sets to make: as many as a timing may time on (``most_placements``; the
    first ``placements`` always are). Physical placement matters on a GPU only."""
    return config.most_placements if device.type == "cuda" else 1


def fitted(config: TimingConfig, most: int) -> TimingConfig:
    """``config`` on at most ``most`` input sets: what a memory plan counted room for."""
    most = max(1, min(most, config.most_placements))
    return replace(config, placements=min(config.placements, most), most_placements=most)


def placements_enough(runs: Sequence[TimingStats], config: TimingConfig) -> bool:
    """Whether the input sets timed so far are enough: the first ``placements`` are always
    timed, and more only while the mean of their medians is known to worse than
    ``placements_rel_err`` (``average``'s error, which counts how far the medians lie apart)
    and their timed calls add up to less than the time budget (a long kernel whose sets spent
    it takes no more: its window stays within the budget it had). The solution's child and
    the trusted side's reference stop by this one rule."""
    if len(runs) < config.placements:
        return False
    if len(runs) >= config.most_placements:
        return True
    timed_s = sum(r.median_ms * r.reps for r in runs) / 1e3
    return timed_s >= config.budget_s or average(runs).rel_err <= config.placements_rel_err


def placement_config(config: TimingConfig, index: int) -> TimingConfig:
    """The procedure of input set ``index``: each set has its share of the time budget (the
    first ``placements`` share it; a set added after them takes a share as large), and only
    the first warms the GPU up to clock (each later one follows timed work on it without a gap:
    its predecessor's, or the other side's when solution and reference are interleaved)."""
    shared = replace(config, budget_s=config.budget_s / config.placements)
    return shared if index == 0 else replace(shared, warmup_ms=config.placement_warmup_ms)


def time_placement(
    call: Callable[[], object],
    device: torch.device,
    config: TimingConfig,
    index: int,
    between_batches: Callable[[], None] | None = None,
    prepare: Callable[[], None] | None = None,
    after_call: Callable[[], None] | None = None,
    steps: TimingSteps | None = None,
) -> TimingStats:
    """Input set ``index`` timed on its own: one step of ``time_fn``, which the trusted side
    also takes one at a time to time the reference between the solution's sets."""
    if device.type != "cuda":
        return time_cpu(call, config, between_batches, prepare, after_call, steps)
    placed = placement_config(config, index)
    return time_cuda(call, placed, between_batches, prepare, after_call, steps)


def time_fn(
    calls: Sequence[Callable[[], object]],
    device: torch.device,
    config: TimingConfig = TimingConfig(),
    between_batches: Callable[[], None] | None = None,
    prepares: Sequence[Callable[[], None]] | None = None,
    after_call: Callable[[], None] | None = None,
    after_placement: Callable[[int], None] | None = None,
    steps: TimingSteps | None = None,
    before_placement: Callable[[int], None] | None = None,
) -> TimingStats:
    """Time each call (one per input set; the first only on a CPU) while the sets timed are not
    enough (``placements_enough``: the first ``placements``, then more while their mean is
    not known well enough), and average their medians; ``prepares[i]`` (if given, and
    ``config.fresh_inputs``) runs before each call of ``calls[i]``, ``after_call`` after every
    call, ``before_placement(i)`` before input set ``i`` is timed and ``after_placement(i)``
    once it is (where the reference is timed interleaved with them); ``steps`` adds up where
    the time went, over every placement."""
    if not (prepares and config.fresh_inputs):
        prepares = [None] * len(calls)

    def time_one(index: int) -> TimingStats:
        call, prepare = calls[index], prepares[index]
        return time_placement(
            call, device, config, index, between_batches, prepare, after_call, steps
        )

    count = len(calls) if device.type == "cuda" else 1
    return time_sets(time_one, count, config, after_placement, before_placement)


def time_sets(
    time_one: Callable[[int], TimingStats],
    count: int,
    config: TimingConfig,
    after_placement: Callable[[int], None] | None = None,
    before_placement: Callable[[int], None] | None = None,
) -> TimingStats:
    """Input sets ``0, 1, ...`` (at most ``count``) timed by ``time_one`` while they are not
    enough (``placements_enough``), their medians averaged: the one loop by which the
    solution's child and the trusted side's reference both stop."""
    runs: list[TimingStats] = []
    while len(runs) < count and not placements_enough(runs, config):
        if before_placement is not None:
            before_placement(len(runs))
        runs.append(time_one(len(runs)))
        if after_placement is not None:
            after_placement(len(runs) - 1)
    return average(runs)


def average(runs: Sequence[TimingStats]) -> TimingStats:
    """One summary of several placements: mean of their medians and quartiles, the extremes
    of all, and the standard error of the mean of the medians. That error is taken from how far
    the medians lie apart, where it exceeds what each median's own error adds up to: a short
    memory-bound kernel's input sets lie 3-8% apart within one evaluation while each set's
    median is known to 0.2%, and an error from within the sets alone (0.2%) said nothing of how
    far the next evaluation's mean would land (1.8%; docs/decisions.md, "What moves a short
    memory-bound kernel's time")."""
    count = len(runs)
    median = sum(r.median_ms for r in runs) / count
    within = math.sqrt(sum((r.rel_err * r.median_ms) ** 2 for r in runs)) / count
    between = statistics.stdev(r.median_ms for r in runs) / math.sqrt(count) if count > 1 else 0.0
    error = max(within, between)
    return TimingStats(
        median_ms=median,
        p25_ms=sum(r.p25_ms for r in runs) / count,
        p75_ms=sum(r.p75_ms for r in runs) / count,
        min_ms=min(r.min_ms for r in runs),
        max_ms=max(r.max_ms for r in runs),
        reps=sum(r.reps for r in runs),
        rel_err=error / median if median > 0 else 0.0,
        placement_medians_ms=[r.median_ms for r in runs],
    )
