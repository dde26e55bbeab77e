"""The timing phase of a job in the sandboxed child: timed calls, spot audits, the profile, and
the outputs of timed calls kept for the trusted side to check.

What is checked of a timed call is what existed when its timed span ended: the output kept of a
timed call is copied right after the call (``timing``'s ``after_call``, stream-ordered after its
end event), so nothing that runs later (an untimed call, the profile, the harness reading it at
the end) can complete or change it. Every call the solution sees here, timed or not, gets new
input contents first (``harness.TimedInputs.refresh``), so no untimed call can recognise the
inputs of a timed one and do its work after the fact.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol, TypeVar

import torch

from kernelrl.env import compare
from kernelrl.env.integrity import vocabulary
from kernelrl.env.integrity.audit import (
    SCALAR_READ,
    AtenAudit,
    LaunchCounter,
    ScalarParameters,
    host_copy,
)
from kernelrl.env.sandbox import harness
from kernelrl.env.sandbox.failures import SolutionFailure, solution_failure
from kernelrl.env.sandbox.local_memory import move_local_memory
from kernelrl.env.timing import TimingConfig, TimingSteps, placements, time_fn

# Between two timed batches, an audited call runs with this probability, on a random input set:
# the solution cannot tell from the outside which of its calls are watched. A GPU timing run of
# four placements has four batches at the least: at 0.875 the chance that none is watched is
# 1 in 4096, as it was with one in two over the twelve batches of 30 calls a placement (a task
# timed on one placement: 1 in 8 either way).
SPOT_AUDIT_PROBABILITY = 0.875

T = TypeVar("T")


def plain_outputs(output: Any, device: torch.device) -> list[Any]:
    """The outputs of one call, accepted only as exactly ``torch.Tensor`` (type identity: a
    subclass would run its own code when the harness reads it), dense, on the job's device, or
    plain numbers, in a tuple or list of exactly those types. Nothing here calls a method a
    solution could have defined."""
    values = list(output) if type(output) in (tuple, list) else [output]
    for index, value in enumerate(values):
        kind = type(value)
        if kind is torch.Tensor:
            if value.layout != torch.strided:
                raise TypeError(f"output {index} is not a dense tensor ({value.layout})")
            if value.device != device:
                raise TypeError(f"output {index} is on {value.device}, expected {device}")
        elif kind not in (int, float, bool, type(None)):
            name = type.__dict__["__name__"].__get__(kind)
            raise TypeError(f"output {index} is a {name}: forward must return torch.Tensor")
    return values


class KeptOutputs:
    """For a few timing input sets drawn at random, one output drawn uniformly from that set's
    calls *after* each call returned (reservoir sampling), so no call can know whether its
    output will be compared: a solution that returns garbage, or leaves an output unwritten to
    finish later, on some timed calls shows. The sets are drawn the same way, as each one's
    first call returns: how many sets a timing takes is known only once it stops
    (``timing.placements_enough``), and every set it timed, the first or the last, is as
    likely as any other to be among the ``count`` kept. The drawn output is copied at once
    (``offer`` runs right after its call), with the version of its input contents
    (``harness.TimedInputs``), from which the trusted side remakes them. The copy it replaces
    is dropped first: the current call's outputs and one copy per drawn set is what the memory
    plan counts."""

    def __init__(self, count: int, rng: random.Random) -> None:
        self.count = count
        self.rng = rng
        self.seen = 0  # input sets whose first call has returned
        self.calls: dict[int, int] = {}  # drawn set: its calls so far
        self.outputs: dict[int, tuple[int, list[Any]]] = {}

    def offer(self, index: int, version: int, output: Any, device: torch.device) -> None:
        if index not in self.calls and not self._draw_set(index):
            return
        self.calls[index] += 1
        if self.rng.randrange(self.calls[index]) != 0:
            return
        try:
            values = plain_outputs(output, device)
        except BaseException as exc:  # noqa: BLE001 - a timed call returned something else
            raise SolutionFailure("runtime", exc) from exc
        self.outputs.pop(index, None)
        with torch.no_grad(), torch.profiler.record_function(harness.HARNESS_RANGE):
            copies = [v.clone() if type(v) is torch.Tensor else v for v in values]
        self.outputs[index] = (version, copies)

    def _draw_set(self, index: int) -> bool:
        """Whether set ``index``, whose first call just returned, is drawn: the first
        ``count`` are, and the n-th after them with probability count/n, in place of one
        drawn before (its copy dropped)."""
        if index < self.seen:  # a set met before and not drawn then
            return False
        self.seen = index + 1
        if self.count == 0:
            return False
        if len(self.calls) >= self.count:
            if self.rng.randrange(self.seen) >= self.count:
                return False
            dropped = self.rng.choice(sorted(self.calls))
            del self.calls[dropped]
            self.outputs.pop(dropped, None)
        self.calls[index] = 0
        return True

    def kept(self) -> list[tuple[int, int, list[Any]]]:
        """The kept copies as (input set, version, plain outputs)."""
        return [
            (index, version, values) for index, (version, values) in sorted(self.outputs.items())
        ]


class Served(Protocol):
    """What a timing run uses of the job that serves it (``job.Job``)."""

    job: dict[str, Any]
    model: torch.nn.Module
    counter: LaunchCounter
    scalars: ScalarParameters
    device: torch.device
    rng: random.SystemRandom
    phase: dict[str, float]
    gpu_only: list[str]
    local_memory_needed: bool

    def timed_inputs(self, seed: int, count: int) -> harness.TimedInputs: ...
    def refresh(self, timed: harness.TimedInputs, index: int) -> None: ...
    def tampered(self) -> list[str]: ...
    def send(self, message: dict[str, Any]) -> None: ...
    def expect(self, kind: str) -> dict[str, Any]: ...
    def send_values(self, outputs: list[Any]) -> None: ...


class TimedRun:
    """One timing run: warm-up and timed calls on every placement, spot audits between
    batches, then (GPU) a few profiled calls; the report and the kept outputs go to the
    trusted side."""

    def __init__(self, served: Served, seed: int) -> None:
        self.served = served
        self.config = TimingConfig(**served.job["timing"])
        start = time.perf_counter()
        self.timed = served.timed_inputs(seed, placements(served.device, self.config))
        served.phase["timing_inputs"] = time.perf_counter() - start
        self.calls_made = 0  # forward calls of the timing phase: timed, warm-up, spot audits
        self.spot = AtenAudit(served.counter, served.scalars)
        self.spot_calls = 0
        self.alone = True
        wanted = harness.TIMED_OUTPUTS_CHECKED if served.job.get("check_timed_outputs") else 0
        rng = random.Random(served.rng.getrandbits(64))
        self.kept = KeptOutputs(wanted, rng)
        self.pending: tuple[int, int, Any] | None = None
        self.waited = 0.0  # seconds the trusted side spent timing the reference meanwhile
        self.spacers: list[torch.Tensor] = []  # blocks kept while local memory is moved

    def forward(self, index: int) -> None:
        """One timed call; its output waits for ``after_call``."""
        self.calls_made += 1
        try:
            with torch.no_grad():
                output = self.served.model(*self.timed.sets[index])
        except BaseException as exc:  # noqa: BLE001 - whatever the solution raises is its own
            raise solution_failure(exc) from exc
        self.pending = (index, self.timed.versions[index], output)

    def after_call(self) -> None:
        """Right after a call (its end event recorded): its output, copied if drawn to be
        kept, then let go."""
        if self.pending is not None:
            index, version, output = self.pending
            self.pending = None
            self.kept.offer(index, version, output, self.served.device)

    def untimed_call(
        self, index: int, audit: AtenAudit | None = None, refreshed: bool = False
    ) -> None:
        """A call outside the timed spans (a spot audit, a profiled call), on new contents like
        any timed call: it cannot recognise a timed call's inputs, and its output is dropped.
        ``refreshed``: the caller gave the set its new contents (``profile_kernels``)."""
        served = self.served
        if not refreshed:
            served.refresh(self.timed, index)
        self.calls_made += 1
        try:
            with torch.no_grad():
                if audit is None:
                    served.model(*self.timed.sets[index])
                    return
                with audit:
                    served.model(*self.timed.sets[index])
                    self.alone = self.alone and audit.on_top()
        except BaseException as exc:  # noqa: BLE001 - whatever the solution raises is its own
            raise solution_failure(exc) from exc

    def spot_audit(self) -> None:
        rng = self.served.rng
        if rng.random() >= SPOT_AUDIT_PROBABILITY:
            return
        self.spot_calls += 1
        self.spot.new_call()
        self.untimed_call(rng.randrange(len(self.timed.sets)), self.spot)

    def reference_turn(self, index: int) -> None:
        """Interleaved timing (the job's ``interleave``): once input set ``index`` is timed, the
        trusted side times the reference's turn, with this child paused, before the next set."""
        started = time.perf_counter()
        self.served.send({"type": "placement_timed", "index": index})
        self.served.expect("time_next")
        self.waited += time.perf_counter() - started

    def local_memory_moved(self, index: int) -> None:
        """Before input set ``index``: the context's local memory allocated anew elsewhere
        (``TimingConfig.move_local_memory``), outside the timed spans."""
        start = time.perf_counter()
        move_local_memory(self.spacers)
        phase = self.served.phase
        phase["local_memory_move"] = phase.get("local_memory_move", 0.0) + (
            time.perf_counter() - start
        )

    def run(self) -> None:
        served, device = self.served, self.served.device
        sets = range(len(self.timed.sets))
        calls = [partial(self.forward, index) for index in sets]
        prepares = [partial(served.refresh, self.timed, index) for index in sets]
        gpu_only_before = len(served.gpu_only)
        served.counter.counts.clear()
        steps = TimingSteps()
        moves = self.config.move_local_memory and served.local_memory_needed
        start = time.perf_counter()
        timing = partial(
            time_fn, calls, device, self.config, self.spot_audit, prepares,
            after_call=self.after_call,
            after_placement=self.reference_turn if served.job.get("interleave") else None,
            steps=steps,
            before_placement=self.local_memory_moved if moves else None,
        )  # fmt: skip
        if device.type == "cuda":
            stats = timing()
        else:  # interpreter timings mean nothing, so every timed call can be watched
            stats, events = profile_cpu_ops(timing)
            reads = self.calls_made * served.scalars.reads_per_call
            profile = {"aten_ops": aten_compute(events, allowed_scalar_reads=reads)}
        served.phase["timing"] = time.perf_counter() - start - self.waited
        served.phase.update(steps.phases())
        launches, calls_made = served.counter.total(), self.calls_made
        start = time.perf_counter()
        if device.type == "cuda":
            # Calls on input sets drawn at random, each on new contents: no pattern marks them.
            drawn = [served.rng.randrange(len(sets)) for _ in range(served.job["profile_calls"])]
            profiled = [partial(self.untimed_call, index, refreshed=True) for index in drawn]
            fresh = [partial(served.refresh, self.timed, index) for index in drawn]
            reads = len(profiled) * served.scalars.reads_per_call
            profile = profile_kernels(
                profiled, device, served.counter, allowed_scalar_reads=reads, prepares=fresh
            )
        served.phase["profile"] = time.perf_counter() - start
        self.report(stats, profile, launches, calls_made, served.gpu_only[gpu_only_before:])

    def report(
        self,
        stats: Any,
        profile: dict[str, Any],
        launches: int,
        calls_made: int,
        gpu_only: list[str],
    ) -> None:
        served = self.served
        tampered = served.tampered() + self.spot.tampered()
        if not self.alone:
            tampered.append("the audit's dispatch mode was removed or covered")
        checked = self.kept.kept()
        served.send(
            {
                "type": "timing",
                "checked_outputs": [
                    {
                        "input_set": index,
                        "version": version,
                        "outputs": compare.describe_outputs(values),
                    }
                    for index, version, values in checked
                ],
                "placements_asked": self.timed.count,
                "runtime": stats.__dict__,
                "profile": profile,
                "timed_calls": calls_made,
                "timed_launches": launches,
                "spot_audits": self.spot_calls,
                "compute_ops": dict(self.spot.compute),
                "tampered": tampered,
                "not_run": gpu_only[0] if gpu_only else "",
            }
        )
        for _, _, values in checked:
            served.send_values(values)


# Around the new input contents of each profiled call, the GPU drained on both sides.
PREPARE_RANGE = "kernelrl::profiled_call_inputs"


def harness_spans(events: list[Any]) -> list[tuple[int, int, int]]:
    """(thread, start, end) of every ``harness.HARNESS_RANGE`` in a profile."""
    return [
        (event.start_thread_id(), event.start_ns(), event.end_ns())
        for event in events
        if event.is_user_annotation() and event.name() == harness.HARNESS_RANGE
    ]


def _in_spans(event: Any, spans: list[tuple[int, int, int]]) -> bool:
    thread, start = event.start_thread_id(), event.start_ns()
    return any(t == thread and lo <= start <= hi for t, lo, hi in spans)


def profile_kernels(
    calls: list[Callable[[], None]],
    device: torch.device,
    counter: LaunchCounter,
    allowed_scalar_reads: int = 0,
    prepares: list[Callable[[], None]] | None = None,
) -> dict[str, Any]:
    """GPU kernels of ``calls`` forward calls under CUPTI: names, time, stream; and the aten ops
    that are not glue, from the profiler's CPU events.

    A marker kernel launched on the caller's current stream first tells which stream id the
    profiler gives that stream, so work on any other stream can be recognised. ``prepares[i]``
    (new input contents) runs before ``calls[i]`` in a window of its own, with the GPU drained
    on both sides of it: a GPU event that starts inside such a window is the harness's, and
    every other one is the calls'. Times, not the profiler's correlation ids, draw that line: a
    kernel launched outside any torch op (a Triton launch) links to no op, and an id from
    another id space could match one of ours.
    """
    from torch.profiler import ProfilerActivity, profile

    prepares = prepares or [None] * len(calls)
    marker = torch.zeros(1, device=device)
    torch.cuda.synchronize()
    counter.counts.clear()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        marker.fill_(1.0)  # not a compute op: it must not count as the solution's aten work
        torch.cuda.synchronize()
        for prepare, call in zip(prepares, calls, strict=True):
            if prepare is not None:
                torch.cuda.synchronize()
                with torch.profiler.record_function(PREPARE_RANGE):
                    prepare()
                    torch.cuda.synchronize()
            call()
        torch.cuda.synchronize()
    events = prof.profiler.kineto_results.events()
    windows = [
        (event.start_ns(), event.end_ns())
        for event in events
        if event.is_user_annotation() and event.name() == PREPARE_RANGE
    ]
    kernels, host_copies, marker_stream = [], [], None
    for event in events:
        if event.device_type() != torch.autograd.DeviceType.CUDA or event.is_user_annotation():
            continue
        if any(lo <= event.start_ns() <= hi for lo, hi in windows):
            continue  # new input contents: the harness's work, not the call's
        name = event.name()
        if name.startswith(("Memcpy", "Memset", "cudaMemcpy")):
            copy = host_copy(event)  # to or from the host: ``host_compute`` on the trusted side
            if copy is not None:
                host_copies.append(copy)
            continue
        stream = event.device_resource_id()
        if marker_stream is None:
            marker_stream = stream  # the first kernel is the marker
            continue
        kernels.append({"name": name, "us": event.duration_ns() / 1e3, "stream": stream})
    return {
        "kernels": kernels,
        "current_stream": marker_stream,
        "calls": len(calls),
        "aten_ops": aten_compute(events, allowed_scalar_reads),
        "triton_launches": dict(counter.counts),
        "host_copies": host_copies,
    }


def profile_cpu_ops(run: Callable[[], T]) -> tuple[T, list[Any]]:
    """``run`` (the whole timed phase on CPU) under the profiler, with the events it recorded.

    The profiler's C++ op events leave nothing in the solution's interpreter, unlike the
    dispatch-mode audit, whose Python frames inside every op a solution can probe (how deep it
    may recurse before an op fails): a solution cannot tell which of these calls are watched,
    and here all of them are, the untimed first one included. On a GPU, where profiling would
    disturb the timings, ``profile_kernels`` watches calls drawn at random after timing.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        value = run()
    return value, prof.profiler.kineto_results.events()


def aten_compute(events: list[Any], allowed_scalar_reads: int = 0) -> dict[str, int]:
    """The aten ops among a profile's CPU events that are not glue, less the reads of the
    model's scalar parameters the calls were allowed (``ScalarParameters``; events carry no
    tensor identity, so they are counted) and the harness's own work (ops inside its
    ``harness.HARNESS_RANGE`` on the same thread: new input contents, copies of kept outputs)."""
    spans = harness_spans(events)
    aten_ops: Counter[str] = Counter()
    for event in events:
        name = event.name()
        on_cpu = event.device_type() == torch.autograd.DeviceType.CPU
        compute = name.startswith("aten::") and not vocabulary.is_glue_aten(name)
        if on_cpu and compute and not _in_spans(event, spans):
            aten_ops[name] += 1
    for name in (SCALAR_READ, "aten::item"):  # the profiler records item() above the read
        aten_ops[name] -= allowed_scalar_reads
    return {name: count for name, count in aten_ops.items() if count > 0}
