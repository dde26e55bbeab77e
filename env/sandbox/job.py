"""Serving one job in the sandboxed child: load the task (and make its inputs once), say so,
then load the solution, then one forward call or one timing run at a time, as the trusted side
asks.

Every correctness call is audited (``integrity.audit``) and timed calls are audited at random
(``timed_run``); inputs are checked unchanged and outputs fresh by fingerprints; outputs leave
through the socket right after the call that made them. The trusted side (``session``) decides
every verdict, whose failure it is included.
"""

from __future__ import annotations

import os
import random
import socket
import sys
import time
import types
from dataclasses import asdict
from typing import Any

import torch

from kernelrl.env import compare, sizes
from kernelrl.env.integrity.audit import AtenAudit, LaunchCounter, ScalarParameters, nbytes
from kernelrl.env.sandbox import compile_ahead, compile_only, failures, harness, timed_run
from kernelrl.env.sandbox.compile_ahead import CompileAhead
from kernelrl.env.sandbox.compile_only import (
    refuse_libdevice_in_interpreter,
    stub_load_inline_for_cpu,
)
from kernelrl.env.sandbox.failures import (
    HarnessFailure,
    NotRunHere,
    SolutionFailure,
    compile_error_stage,
    gpu_only_reason,
    solution_failure,
)
from kernelrl.env.sandbox.guard import harness_guard
from kernelrl.env.sandbox.local_memory import LocalMemoryWatch
from kernelrl.env.sandbox.protocol import (
    SOLUTION_MODULE,
    TASK_MODULE,
    recv_message,
    send_message,
)
from kernelrl.env.sandbox.stream import OutputRing, send_tensor_bytes
from kernelrl.env.sandbox.timed_run import TimedRun, plain_outputs
from kernelrl.env.sandbox.triton_launchers import LaunchersMade
from kernelrl.env.timing import TimingConfig, fitted


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
    """The task's get_inputs failed in the sandbox. Before the solution was loaded that is ours;
    after, the worker counts it as the solution's (the solution shares this process's memory and
    holds the input tensors), unless it sees itself that the device was short."""
    if isinstance(exc, torch.OutOfMemoryError):
        first_line = str(exc).splitlines()[0] if str(exc) else "out of memory"
        return HarnessFailure(
            f"the task's inputs did not fit in the memory left to the sandbox ({first_line})",
            "inputs",
        )
    return HarnessFailure(f"the task's get_inputs failed: {exc!r}", "inputs")


def defer_gpu_only_launches(noted: list[str]) -> None:
    """Under Triton's CPU interpreter, a launch that only a GPU can run (inline PTX, libdevice,
    an autotuner's benchmark) is noted in ``noted`` and skipped, rather than ending the call:
    the rest of the forward still runs under the audit, so what it does besides (torch compute
    after the launch) is judged, and the call ends ``not_run`` only when nothing else is."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.interpreter import InterpretedFunction

    for cls in (InterpretedFunction, Autotuner):
        original = cls.run

        def run(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            try:
                return _original(self, *args, **kwargs)
            except Exception as exc:
                reason = gpu_only_reason(exc)
                if reason is None:
                    raise
                noted.append(reason)
                return None

        cls.run = run


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
        ring: OutputRing,
        job: dict[str, Any],
        counter: LaunchCounter,
        entry: types.ModuleType,
    ) -> None:
        self.sock = sock
        self.ring = ring
        self.entry = entry  # the child's entry module, watched with this one
        self.job = job
        self.counter = counter
        self.device = torch.device(job["device"])
        self.phase: dict[str, float] = {}
        self.rng = random.SystemRandom()
        self.calls = 0
        self.previous: tuple[list[torch.Tensor], list[tuple[int, int]]] | None = None
        self.gpu_only: list[str] = []  # launches skipped as only a GPU can run them (CPU)
        self.compile_ahead: CompileAhead | None = None  # the companion's, if one was handed
        self.launchers = LaunchersMade(self.phase)  # signatures the worker may build for others
        self.local_memory_needed = False  # the first call's kernels needed local memory

    def send(self, message: dict[str, Any]) -> None:
        extra = {"compile_ahead": self.compile_ahead.report()} if self.compile_ahead else {}
        if launchers := self.launchers.take():
            extra["launchers"] = launchers
        send_message(self.sock, {**message, "phase": self.phase, **extra})

    def expect(self, kind: str) -> dict[str, Any]:
        """The trusted side's next message, which must be a ``kind``: the two sides take turns."""
        reply = recv_message(self.sock)
        if reply.get("type") != kind:
            raise HarnessFailure(f"expected {kind!r}, got {reply.get('type')!r}", "harness")
        return reply

    def tampered(self) -> list[str]:
        return self.guard.verify()

    def task_loaded(self) -> None:
        """Make the task's inputs once, drop them, say the task is loaded and take the solution.
        Until then only our code has run here: a failure so far is ours, and the inputs are
        shown to fit in this sandbox before the solution's code can take its memory."""
        if self.job.get("probe_inputs"):
            probe = self._inputs(self.rng.getrandbits(31))
            del probe
            if self.device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.empty_cache()  # the worker reads what the device has left for us
        self.send({"type": "task_loaded"})
        solution = self.expect("solution")
        self.job["solution_source"] = str(solution["solution_source"])
        if solution.get("compile_ahead"):
            channel = compile_ahead.receive_companion(self.sock)
            self.compile_ahead = CompileAhead(channel, self.phase)

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
        self.task_loaded()
        if job["backend"] == "cuda" and self.device.type == "cpu":
            stub_load_inline_for_cpu(os.getcwd())
        if job["backend"] == "triton" and self.device.type == "cpu":
            refuse_libdevice_in_interpreter()
            defer_gpu_only_launches(self.gpu_only)
        self.guard = harness_guard(
            [self.entry, sys.modules[__name__], failures, compile_only, compile_ahead, timed_run]
        )
        if self.compile_ahead is not None:
            self.compile_ahead.install(job["solution_source"])
        if self.device.type == "cuda":
            self.launchers.install()

        start = time.perf_counter()
        # Compute at import (a module-level table) is judged as the constructor's is: one audit
        # watches both, reported as ``init_compute``.
        audit = AtenAudit(self.counter)
        try:
            with audit:
                solution = harness.load_module(job["solution_source"], SOLUTION_MODULE)
        except BaseException as exc:  # noqa: BLE001 - SystemExit from the solution is its own
            self.phase["load"] = time.perf_counter() - start
            if type(exc) is compile_only.CompiledOnly:
                self.send({"type": "not_run", "reason": str(exc)})
                return
            raise SolutionFailure("compile", exc) from exc
        self.phase["load"] = time.perf_counter() - start

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
                self.time(int(message["seed"]))
            else:
                return

    def await_admission(self, task: Any) -> None:
        """Report the task's footprint, measured here on the meta device, and wait until the
        trusted side has reserved that much of the GPU before anything is allocated on it.

        Curation sends untrusted corpus records, whose code may only run in a sandbox, so their
        footprint cannot be measured on the trusted side as the evaluator does for our tasks. A
        record that under-reports can only take memory promised to others: curation reruns a
        run that ran out of GPU memory alone, never blaming the record for it.
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
        reply = self.expect("admitted")
        if "timing_placements" in reply:
            timing = TimingConfig(**self.job["timing"])
            self.job["timing"] = asdict(fitted(timing, int(reply["timing_placements"])))

    def _inputs(self, seed: int) -> list[Any]:
        try:
            return harness.make_inputs(self.task, seed, self.device)
        except Exception as exc:
            raise inputs_failure(exc) from exc

    def timed_inputs(self, seed: int, count: int) -> harness.TimedInputs:
        try:
            return harness.TimedInputs(
                lambda s: harness.make_inputs(self.task, s, self.device), seed, count
            )
        except Exception as exc:
            raise inputs_failure(exc) from exc

    def refresh(self, timed: harness.TimedInputs, index: int) -> None:
        try:
            timed.refresh(index)
        except Exception as exc:
            failure = inputs_failure(exc)
            if timed.dropped_held():
                failure.args = (f"{failure}; the model still holds the inputs of its calls",)
            raise failure from exc

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
        watch = LocalMemoryWatch() if self.watches_local_memory() else None
        call_start = time.perf_counter()
        skipped = len(self.gpu_only)
        try:
            with torch.no_grad(), audit:
                output = self.model(*inputs)
                alone = audit.on_top()
            if len(self.gpu_only) > skipped:  # its output is not what it would be on a GPU
                raise NotRunHere(self.gpu_only[skipped])
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            outputs = plain_outputs(output, self.device)
        except BaseException as exc:  # noqa: BLE001 - whatever the solution raises is its own
            self._stopped(exc, audit, skipped)
            return
        self.calls += 1
        if self.calls == 1:  # the first call compiles the kernels (JIT) and runs them once
            self.phase["first_call"] = time.perf_counter() - call_start
            self.local_memory_needed = watch is not None and watch.needed()
        tensors = harness.tensors_in(outputs)
        try:
            flags = self._call_flags(input_tensors, before, tensors)
        except Exception as exc:
            # These tensors were read before the call; only the solution can have broken them
            # since (an input's storage resized to nothing, a kept output freed), unless the GPU
            # memory admitted for this evaluation was taken by other work (the worker sees).
            raise solution_failure(exc) from exc
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

    def watches_local_memory(self) -> bool:
        """Whether this call is watched for the local memory its kernels need: the first, on a
        GPU, where the timing moves the local memory (``TimingConfig.move_local_memory``)."""
        moves = bool(self.job.get("timing", {}).get("move_local_memory"))
        return moves and self.device.type == "cuda" and self.calls == 0

    def _stopped(self, exc: BaseException, audit: AtenAudit, skipped: int) -> None:
        """A checked call that did not return plain outputs: stopped at its first compute op
        (or computed, then failed), needing a GPU for what it launched (``not_run``, sent only
        when the audit saw nothing else), or the solution's failure (raised)."""
        tampered = self.guard.verify() + audit.tampered()
        if audit.compute:  # stopped at its first compute op, or computed and then failed
            self.send(
                {"type": "compute_seen", "compute_ops": dict(audit.compute), "tampered": tampered}
            )
            return
        failure = solution_failure(exc)
        if len(self.gpu_only) > skipped or type(failure) is NotRunHere:
            reason = self.gpu_only[skipped] if len(self.gpu_only) > skipped else str(failure)
            self.send({"type": "not_run", "reason": reason, "tampered": tampered})
            return
        raise failure from exc

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
                send_tensor_bytes(self.sock, self.ring, value)

    def time(self, seed: int) -> None:
        self.previous = None
        TimedRun(self, seed).run()
