"""Serving one job in the sandboxed child: load the task and the solution, then one forward
call or one timing run at a time, as the trusted side asks.

Every correctness call is audited (``integrity.audit``) and timed calls are audited at random;
inputs are checked unchanged and outputs fresh by fingerprints; outputs leave through the socket
right after the call that made them. The trusted side (``session``) decides every verdict.
"""

from __future__ import annotations

import os
import random
import socket
import sys
import time
import types
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import torch

from kernelrl.env import compare, sizes
from kernelrl.env.integrity import vocabulary
from kernelrl.env.integrity.audit import (
    SCALAR_READ,
    AtenAudit,
    LaunchCounter,
    ScalarParameters,
    nbytes,
)
from kernelrl.env.sandbox import compile_only, failures, harness
from kernelrl.env.sandbox.compile_only import (
    refuse_libdevice_in_interpreter,
    stub_load_inline_for_cpu,
)
from kernelrl.env.sandbox.failures import (
    HarnessFailure,
    SolutionFailure,
    compile_error_stage,
    solution_failure,
)
from kernelrl.env.sandbox.guard import harness_guard
from kernelrl.env.sandbox.protocol import (
    SOLUTION_MODULE,
    TASK_MODULE,
    recv_message,
    send_message,
    send_tensor_bytes,
)
from kernelrl.env.timing import TimingConfig, placements, time_fn

# Between two timed batches, an audited call runs with this probability, on a random input set:
# the solution cannot tell from the outside which of its calls are watched.
SPOT_AUDIT_PROBABILITY = 0.5
# Timing input sets whose kept output (one of its timed calls, drawn after the fact) the
# trusted side compares with the reference.
TIMED_OUTPUTS_CHECKED = 2

T = TypeVar("T")


def fingerprint(tensor: torch.Tensor, chunk_bytes: int = 64 * 2**20) -> tuple[int, int]:
    """Two position-weighted sums of a tensor's 32-bit words (bytes when its size is not a
    multiple of 4), computed where it lives, chunk by chunk: enough to tell whether it changed,
    without a second copy of a multi-GiB tensor. Words, not bytes, and one host sync per
    tensor: a 6 GiB output is fingerprinted in milliseconds on a GPU, not seconds."""
    flat = tensor.detach().reshape(-1)
    if flat.numel() == 0:
        return (0, 0)
    data = flat.contiguous().view(torch.uint8)
    if data.numel() % 4 == 0:
        data = data.view(torch.int32)
    step = max(chunk_bytes // data.element_size(), 1)
    sums = torch.zeros(2, dtype=torch.int64, device=data.device)
    for start in range(0, data.numel(), step):
        words = data[start : start + step].to(torch.int64)
        positions = torch.arange(start, start + words.numel(), device=words.device) % 65521 + 1
        sums[0] += words.sum()
        sums[1] += (words * positions).sum()
    plain, weighted = sums.tolist()
    return (plain, weighted)


def inputs_failure(exc: Exception) -> HarnessFailure:
    """The task's get_inputs failed in the sandbox: the harness's failure, never the kernel's."""
    if isinstance(exc, torch.OutOfMemoryError):
        first_line = str(exc).splitlines()[0] if str(exc) else "out of memory"
        return HarnessFailure(
            f"the task's inputs did not fit in the memory left to the sandbox ({first_line})",
            "inputs",
        )
    return HarnessFailure(f"the task's get_inputs failed: {exc!r}", "inputs")


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
    timed calls *after* each call returned (reservoir sampling), so no call can know whether
    its output will be compared: a solution that returns garbage or ``torch.empty`` on some
    timed calls shows. Each output is kept with the version of its input contents
    (``harness.TimedInputs``), from which the trusted side remakes them. Holding one output per
    drawn set is what the memory plan allows (the current call's outputs and one more)."""

    def __init__(self, sets: int, count: int, rng: random.Random) -> None:
        self.rng = rng
        self.calls = dict.fromkeys(sorted(rng.sample(range(sets), min(count, sets))), 0)
        self.outputs: dict[int, tuple[int, Any]] = {}

    def offer(self, index: int, version: int, output: Any) -> None:
        if index in self.calls:
            self.calls[index] += 1
            if self.rng.randrange(self.calls[index]) == 0:
                self.outputs[index] = (version, output)

    def plain(self, device: torch.device) -> list[tuple[int, int, list[Any]]]:
        """The kept outputs as (input set, version, plain outputs (``plain_outputs``))."""
        return [
            (index, version, plain_outputs(output, device))
            for index, (version, output) in sorted(self.outputs.items())
        ]


def sampled_outputs(outputs: list[Any], size: int) -> tuple[list[Any], list[dict[str, Any]]]:
    """Each tensor output reduced to every ``stride``-th value (at most ``size``), with its
    full shape and its count of non-finite values: what curation's validate compares between
    two runs of a reference. A 6 GiB output then crosses the socket as 8 MiB."""
    sampled, described = [], compare.describe_outputs(outputs)
    for value, entry in zip(outputs, described, strict=True):
        if isinstance(value, torch.Tensor):
            flat = value.detach().reshape(-1)
            stride = max(-(-flat.numel() // size), 1)
            non_finite = 0
            if flat.is_floating_point() or flat.is_complex():
                non_finite = int((~torch.isfinite(flat)).sum())
            value = flat[::stride].contiguous()
            entry.update(
                full_shape=entry["shape"],
                shape=list(value.shape),
                nbytes=value.numel() * value.element_size(),
                stride=stride,
                non_finite=non_finite,
            )
        sampled.append(value)
    return sampled, described


class Job:
    """One solution, served call by call as the trusted side asks.

    The trusted side sends the seed of each input set only when it asks for that call, so no
    future inputs exist in this process; outputs leave through the socket right after the call
    that made them, described then streamed in chunks; every correctness call is audited, and
    timed calls are audited at random.
    """

    def __init__(
        self,
        sock: socket.socket,
        job: dict[str, Any],
        counter: LaunchCounter,
        entry: types.ModuleType,
    ) -> None:
        self.sock = sock
        self.entry = entry  # the child's entry module, watched with this one
        self.job = job
        self.counter = counter
        self.device = torch.device(job["device"])
        self.phase: dict[str, float] = {}
        self.rng = random.SystemRandom()
        self.calls = 0
        self.previous: tuple[list[torch.Tensor], list[tuple[int, int]]] | None = None

    def send(self, message: dict[str, Any]) -> None:
        send_message(self.sock, {**message, "phase": self.phase})

    def serve(self) -> None:
        job = self.job
        try:
            task = harness.load_module(job["task_source"], TASK_MODULE, job["size_overrides"])
        except Exception as exc:
            raise HarnessFailure(f"the task did not load in the sandbox: {exc!r}", "task") from exc
        if not job.get("expose_task", False):
            sys.modules.pop(TASK_MODULE, None)  # the solution cannot reach the task's code
        self.task = task
        if job.get("await_admission"):
            self.await_admission(task)
        if job["backend"] == "cuda" and self.device.type == "cpu":
            stub_load_inline_for_cpu(os.getcwd())
        if job["backend"] == "triton" and self.device.type == "cpu":
            refuse_libdevice_in_interpreter()
        self.guard = harness_guard([self.entry, sys.modules[__name__], failures, compile_only])

        start = time.perf_counter()
        try:
            solution = harness.load_module(job["solution_source"], SOLUTION_MODULE)
        except BaseException as exc:  # noqa: BLE001 - SystemExit from the solution is its own
            self.phase["load"] = time.perf_counter() - start
            if type(exc) is compile_only.CompiledOnly:
                self.send({"type": "not_run", "reason": str(exc)})
                return
            raise SolutionFailure("compile", exc) from exc
        self.phase["load"] = time.perf_counter() - start

        audit = AtenAudit(self.counter)
        try:
            with audit:
                self.model = harness.build_model(
                    solution.ModelNew, task, job["model_seed"], self.device
                )
        except BaseException as exc:  # noqa: BLE001 - whatever the solution raises is its own
            raise SolutionFailure(compile_error_stage(exc), exc) from exc
        self.scalars = ScalarParameters.of(self.model)
        self.send(
            {
                "type": "loaded",
                "tampered": self.guard.verify() + audit.tampered(),
                "init_compute": dict(audit.compute),
            }
        )

        while True:
            message = recv_message(self.sock)
            if message["type"] == "call":
                self.call(int(message["seed"]))
            elif message["type"] == "time":
                self.time(int(message["seed"]), float(message.get("settle_s", 0.0)))
            else:
                return

    def await_admission(self, task: Any) -> None:
        """Report the task's footprint, measured here on the meta device, and wait until the
        trusted side has reserved that much of the GPU before anything is allocated on it.

        Curation sends untrusted corpus records, whose code may only run in a sandbox, so their
        footprint cannot be measured on the trusted side as the evaluator does for our tasks. A
        record that under-reports can only take memory promised to others: their out-of-memory
        errors then read as ours (``gpu_bytes_admitted``) and are rerun alone, never blamed.
        """
        try:
            footprint = sizes.measure_module(task)
            numbers = {
                "input_bytes": footprint.input_bytes,
                "param_bytes": footprint.param_bytes,
                "output_bytes": footprint.output_bytes,
            }
        except Exception as exc:  # the forward run below reports the task's own error
            numbers = {"error": repr(exc)[:300]}
        self.send({"type": "footprint", **numbers})
        reply = recv_message(self.sock)
        if reply.get("type") != "admitted":
            raise HarnessFailure(f"expected 'admitted', got {reply.get('type')!r}", "harness")
        self.job["gpu_bytes_admitted"] = int(reply["bytes"])
        if "timing_placements" in reply:
            self.job["timing"]["placements"] = int(reply["timing_placements"])

    def _inputs(self, seed: int) -> list[Any]:
        try:
            return harness.make_inputs(self.task, seed, self.device)
        except Exception as exc:
            raise inputs_failure(exc) from exc

    def _timed_inputs(self, seed: int, count: int) -> harness.TimedInputs:
        try:
            return harness.TimedInputs(
                lambda s: harness.make_inputs(self.task, s, self.device), seed, count
            )
        except Exception as exc:
            raise inputs_failure(exc) from exc

    def _refresh(self, timed: harness.TimedInputs, index: int) -> None:
        try:
            timed.refresh(index)
        except torch.OutOfMemoryError as exc:
            if timed.dropped_held():  # the model kept the inputs of its calls
                raise solution_failure(exc, self.job.get("gpu_bytes_admitted")) from exc
            raise inputs_failure(exc) from exc
        except Exception as exc:
            raise inputs_failure(exc) from exc

    def call(self, seed: int) -> None:
        start = time.perf_counter()
        inputs = self._inputs(seed)
        input_tensors = harness.tensors_in(inputs)
        before = [fingerprint(t) for t in input_tensors]
        self.counter.counts.clear()
        # Judging a solution, compute is a violation already at its first op; a reference run
        # for curation computes by design and runs to the end.
        stop = bool(self.job.get("stop_at_compute"))
        audit = AtenAudit(self.counter, self.scalars, stop_at_compute=stop)
        call_start = time.perf_counter()
        try:
            with torch.no_grad(), audit:
                output = self.model(*inputs)
                alone = audit.on_top()
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            outputs = plain_outputs(output, self.device)
        except BaseException as exc:  # noqa: BLE001 - whatever the solution raises is its own
            if audit.compute:  # stopped at its first compute op, or computed and then failed
                tampered = self.guard.verify() + audit.tampered()
                self.send(
                    {
                        "type": "compute_seen",
                        "compute_ops": dict(audit.compute),
                        "tampered": tampered,
                    }
                )
                return
            raise solution_failure(exc, self.job.get("gpu_bytes_admitted")) from exc
        self.calls += 1
        if self.calls == 1:  # the first call compiles the kernels (JIT) and runs them once
            self.phase["first_call"] = time.perf_counter() - call_start
        tensors = harness.tensors_in(outputs)
        try:
            flags = self._call_flags(input_tensors, before, tensors)
        except Exception as exc:
            # These tensors were read before the call; only the solution can have broken them
            # since (an input's storage resized to nothing, a kept output freed), unless the GPU
            # memory admitted for this evaluation was taken by other work.
            raise solution_failure(exc, self.job.get("gpu_bytes_admitted")) from exc
        tampered = self.guard.verify() + audit.tampered()
        if not alone:
            tampered.append("the audit's dispatch mode was removed or covered")
        io_bytes = sum(nbytes(t) for t in input_tensors) + sum(nbytes(t) for t in tensors)
        self.phase["correctness"] = self.phase.get("correctness", 0.0) + (
            time.perf_counter() - start
        )
        sample_size = self.job.get("sample_outputs")
        if sample_size:
            outputs, described = sampled_outputs(outputs, int(sample_size))
        else:
            described = compare.describe_outputs(outputs)
        self.send(
            {
                "type": "outputs",
                "outputs": described,
                "launches": self.counter.total(),
                "flags": flags,
                "compute_ops": dict(audit.compute),
                "copied_bytes": audit.copied_bytes,
                "io_bytes": io_bytes,
                "tampered": tampered,
            }
        )
        self.send_values(outputs)
        # Held until the next call: an output handed out again, or changed by that call, shows.
        self.previous = (tensors, [fingerprint(t) for t in tensors])
        del inputs, input_tensors

    def _call_flags(
        self, inputs: list[torch.Tensor], before: list[Any], outputs: list[torch.Tensor]
    ) -> list[str]:
        """What a call did to its inputs and to the outputs of the call before it."""
        flags = []
        if any(fingerprint(t) != b for t, b in zip(inputs, before, strict=True)):
            flags.append("input_mutated")
        if any(harness.storages_overlap(o, i) for o in outputs for i in inputs):
            flags.append("output_aliases_input")
        if self.previous is not None:
            earlier, prints = self.previous
            if any(harness.storages_overlap(o, e) for o in outputs for e in earlier) or any(
                fingerprint(e) != p for e, p in zip(earlier, prints, strict=True)
            ):
                flags.append("output_reused")
        return flags

    def send_values(self, outputs: list[Any]) -> None:
        for value in outputs:
            if type(value) is torch.Tensor:
                send_tensor_bytes(self.sock, value)

    def time(self, seed: int, settle_s: float = 0.0) -> None:
        settle_until = time.monotonic() + settle_s
        config = TimingConfig(**self.job["timing"])
        self.previous = None
        timed = self._timed_inputs(seed, placements(self.device, config))
        input_sets = timed.sets
        model, counter = self.model, self.counter
        made = [0]
        spot = AtenAudit(counter, self.scalars)
        spot_calls = [0]
        alone = [True]
        wanted = TIMED_OUTPUTS_CHECKED if self.job.get("check_timed_outputs") else 0
        kept = KeptOutputs(len(input_sets), wanted, random.Random(self.rng.getrandbits(64)))

        def forward(index: int) -> None:
            made[0] += 1
            try:
                with torch.no_grad():
                    output = model(*input_sets[index])
                kept.offer(index, timed.versions[index], output)
            except BaseException as exc:  # noqa: BLE001 - whatever the solution raises is its own
                raise solution_failure(exc, self.job.get("gpu_bytes_admitted")) from exc

        def timed_call(index: int) -> Callable[[], None]:
            return lambda: forward(index)

        def spot_audit() -> None:
            if self.rng.random() >= SPOT_AUDIT_PROBABILITY:
                return
            inputs = self.rng.choice(input_sets)
            made[0] += 1
            spot_calls[0] += 1
            spot.new_call()
            try:
                with torch.no_grad(), spot:
                    model(*inputs)
                    alone[0] = alone[0] and spot.on_top()
            except BaseException as exc:  # noqa: BLE001 - whatever the solution raises is its own
                raise solution_failure(exc, self.job.get("gpu_bytes_admitted")) from exc

        calls = [timed_call(index) for index in range(len(input_sets))]
        prepares = [partial(self._refresh, timed, index) for index in range(len(input_sets))]
        counter.counts.clear()
        start = time.perf_counter()
        if self.device.type == "cuda":
            stats = time_fn(calls, self.device, config, spot_audit, prepares, settle_until)
        else:  # interpreter timings mean nothing, so every timed call can be watched
            stats, events = profile_cpu_ops(
                lambda: time_fn(calls, self.device, config, spot_audit, prepares)
            )
            reads = made[0] * self.scalars.reads_per_call
            profile = {"aten_ops": aten_compute(events, allowed_scalar_reads=reads)}
        self.phase["timing"] = time.perf_counter() - start
        launches, calls_made = counter.total(), made[0]
        start = time.perf_counter()
        if self.device.type == "cuda":
            # Timed calls on input sets drawn at random: no pattern marks them as profiled.
            profiled = [self.rng.choice(calls) for _ in range(self.job["profile_calls"])]
            reads = len(profiled) * self.scalars.reads_per_call
            profile = profile_kernels(profiled, self.device, counter, allowed_scalar_reads=reads)
        self.phase["profile"] = time.perf_counter() - start
        tampered = self.guard.verify() + spot.tampered()
        if not alone[0]:
            tampered.append("the audit's dispatch mode was removed or covered")
        try:
            checked = kept.plain(self.device)
        except BaseException as exc:  # noqa: BLE001 - a timed call returned something else
            raise SolutionFailure("runtime", exc) from exc
        self.send(
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
                "placements_asked": timed.count,
                "runtime": stats.__dict__,
                "profile": profile,
                "timed_calls": calls_made,
                "timed_launches": launches,
                "spot_audits": spot_calls[0],
                "compute_ops": dict(spot.compute),
                "tampered": tampered,
            }
        )
        for _, _, values in checked:
            self.send_values(values)


def profile_kernels(
    calls: list[Callable[[], None]],
    device: torch.device,
    counter: LaunchCounter,
    allowed_scalar_reads: int = 0,
) -> dict[str, Any]:
    """GPU kernels of ``calls`` forward calls under CUPTI: names, time, stream; and the aten ops
    that are not glue, from the profiler's CPU events.

    A marker kernel launched on the caller's current stream first tells which stream id the
    profiler gives that stream, so work on any other stream can be recognised.
    """
    from torch.profiler import ProfilerActivity, profile

    marker = torch.zeros(1, device=device)
    torch.cuda.synchronize()
    counter.counts.clear()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        marker.fill_(1.0)  # not a compute op: it must not count as the solution's aten work
        torch.cuda.synchronize()
        for call in calls:
            call()
        torch.cuda.synchronize()
    kernels = []
    marker_stream = None
    events = prof.profiler.kineto_results.events()
    aten_ops = aten_compute(events, allowed_scalar_reads)
    for event in events:
        name = event.name()
        if event.device_type() != torch.autograd.DeviceType.CUDA or event.is_user_annotation():
            continue
        if name.startswith(("Memcpy", "Memset", "cudaMemcpy")):
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
        "aten_ops": aten_ops,
        "triton_launches": dict(counter.counts),
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
    tensor identity, so they are counted) and the harness's own input generation (ops inside
    its ``harness.INPUTS_RANGE`` on the same thread)."""
    harness_spans = [
        (event.start_thread_id(), event.start_ns(), event.end_ns())
        for event in events
        if event.is_user_annotation() and event.name() == harness.INPUTS_RANGE
    ]

    def in_harness_span(event: Any) -> bool:
        thread, start = event.start_thread_id(), event.start_ns()
        return any(t == thread and lo <= start <= hi for t, lo, hi in harness_spans)

    aten_ops: Counter[str] = Counter()
    for event in events:
        name = event.name()
        on_cpu = event.device_type() == torch.autograd.DeviceType.CPU
        compute = name.startswith("aten::") and not vocabulary.is_glue_aten(name)
        if on_cpu and compute and not in_harness_span(event):
            aten_ops[name] += 1
    for name in (SCALAR_READ, "aten::item"):  # the profiler records item() above the read
        aten_ops[name] -= allowed_scalar_reads
    return {name: count for name, count in aten_ops.items() if count > 0}
