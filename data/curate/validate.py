"""Validate task references by running them, sandboxed, through the environment's machinery.

Why a sandboxed child and not the evaluator: inside the environment a reference is trusted
(it comes from our task suite) and runs in the worker process. A record of a corpus being
curated is not trusted yet; running it in the curation process would let any record read
files, open sockets or crash the run. The evaluator cannot run a reference for us either: it
computes references in its own process, and the task's ``Model`` posing as a solution would
fail the static checks ("no custom kernel"), which exist for solutions, not references.

So this step talks to the environment's sandbox directly (``kernelrl.env.sandbox.processes``):
each run is a fresh child with an empty network namespace, a private scratch directory, a
scrubbed environment, CPU/memory/file-size limits and a wall-clock deadline. The job it gets is
the ordinary evaluation job with the reference posing as the solution
(``from kernelrl_task import Model as ModelNew``): the child builds the model from the task's
``get_init_inputs`` under a seed, makes inputs under seeds, runs forward, reports the aten ops
it dispatched, and, when asked, times it with the environment's timing procedure. The child
samples each output (every k-th value, at most 2**20, and its count of non-finite values) and
sends the sample through the session (``kernelrl.env.sandbox.session``), so neither the socket
nor host memory grows with a task's tensor sizes.

On a GPU, a run starts only once the footprint the child measured (meta device, in the sandbox)
is reserved on the device (``kernelrl.env.admission``); a pair of runs that fails for a reason
that may be ours (a harness error, or out of memory beside other runs) is run once more alone,
and a harness error that persists is reported, never journaled, so a rerun tries it again.

A reference passes when, on the target device:
- it loads, constructs and runs (no exception, crash, hang or memory blow-up);
- every output is finite;
- a second run in a second child with the same seeds (every input set) agrees with the first
  within the task's own tolerances (a reference that does not reproduce itself cannot grade a
  solution);
- its output depends on its inputs (different input seeds give different outputs; optional);
- it leaves its inputs unchanged (a solution doing the same would fail ``input_mutated``);
- its median runtime is within the budget (optional).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from datasets import Dataset
from rich.console import Console

from kernelrl.data.curate.report import StepReport, log_step, step_progress, timed
from kernelrl.data.curate.resume import Journal
from kernelrl.data.schema import make_dataset
from kernelrl.env.admission import GpuMemoryBudget, plan_for
from kernelrl.env.evaluator import resolve_device
from kernelrl.env.reference import device_name
from kernelrl.env.sandbox.processes import Child, ChildDied, ChildPool
from kernelrl.env.sandbox.session import SandboxSession, reference_as_solution
from kernelrl.env.task import Task, task_from_row
from kernelrl.env.timing import TimingConfig


@dataclass
class ValidateConfig:
    device: str = "auto"  # cpu, cuda or auto
    gpu_index: int = 0
    timeout_s: float = 120.0  # wall clock for one sandboxed run (load, calls, timing)
    max_runtime_ms: float | None = None  # budget for the reference's median runtime
    num_input_sets: int = 2
    seed: int = 0  # model and input seeds derive from it: reruns validate identically
    workers: int = 2  # sandboxed runs in flight
    host_memory_bytes: int = 8 * 2**30
    reject_constant_outputs: bool = True
    timing: TimingConfig = field(default_factory=TimingConfig)

    def resolved_device(self) -> str:
        return resolve_device(self.device)

    def verdict_settings(self) -> dict[str, Any]:
        """The settings a verdict depends on, which key the journal: a rerun with more or fewer
        workers resumes where the last one stopped."""
        settings = asdict(self)
        del settings["workers"]
        return settings


# Values of each output kept to compare two runs: a strided sample taken in the sandbox, so that
# a 6 GiB output of a KernelBench task costs 8 MiB on the socket and here, whatever its size.
SAMPLED_VALUES = 2**20


@dataclass
class OutputDigest:
    """One output of one run, as the sandbox reduced it: shape, dtype, how many values are not
    finite, and every ``stride``-th value in fp64 (a plain value is kept as it is).

    The counts come from the child that ran the record: a record could misreport them, but a
    record is not a trust boundary here (validation decides whether a reference is usable; a
    record that passes becomes trusted task code), so nothing is lost by believing them."""

    shape: tuple[int, ...] = ()
    dtype: str = ""
    value: Any = None
    non_finite: int = 0
    stride: int = 1
    sample: torch.Tensor | None = None

    @property
    def is_tensor(self) -> bool:
        return self.sample is not None


class _Digester:
    """Builds the digests of one call's outputs from the samples the sandbox sent."""

    def __init__(self, described: list[dict[str, Any]]) -> None:
        self.digests: list[OutputDigest] = []
        self._parts: list[list[torch.Tensor]] = []
        for entry in described:
            if entry.get("kind") != "tensor":
                self.digests.append(OutputDigest(value=entry.get("value", entry.get("type"))))
            else:
                shape = tuple(int(d) for d in entry["full_shape"])
                digest = OutputDigest(shape, str(entry["dtype"]), stride=int(entry["stride"]))
                digest.non_finite = int(entry["non_finite"])
                self.digests.append(digest)
            self._parts.append([])

    def add(self, index: int, chunk: torch.Tensor) -> None:
        self._parts[index].append(chunk.to(torch.float64).clone())

    def finish(self) -> list[OutputDigest]:
        for digest, parts in zip(self.digests, self._parts, strict=True):
            if digest.dtype:
                digest.sample = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)
        return self.digests


@dataclass
class Probe:
    """What one sandboxed run of a reference reported."""

    failure: str | None = None  # a removal reason when the run failed
    detail: str = ""
    outputs: list[list[OutputDigest]] = field(default_factory=list)
    runtime_ms: float | None = None
    aten_ops: dict[str, int] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)
    phase: dict[str, float] = field(default_factory=dict)
    network: str = ""
    out_of_memory: bool = False  # the failure was a GPU out-of-memory error


class ReferenceProber:
    """Runs references in sandboxed children; thread-safe, one child per run."""

    def __init__(self, config: ValidateConfig) -> None:
        self.config = config
        self.kind = config.resolved_device()
        gpu = config.gpu_index if self.kind == "cuda" else None
        self.children = ChildPool(self.kind, gpu, spare=max(config.workers, 1))
        self.gpu_lock = threading.Lock()
        self._active: set[Child] = set()
        self._active_lock = threading.Lock()
        device = torch.device("cuda", config.gpu_index) if self.kind == "cuda" else None
        self.device_name = device_name(device or torch.device("cpu"))
        # Runs in flight and children warming each hold a CUDA context.
        self.gpu_budget = (
            GpuMemoryBudget.for_device(device, processes=2 * max(config.workers, 1))
            if device is not None
            else None
        )

    def close(self) -> None:
        self.children.close()

    def interrupt(self) -> None:
        """Kill the runs in flight (Ctrl-C): their reports are discarded, nothing of them is
        journaled, and the next run validates those records again."""
        with self._active_lock:
            active = list(self._active)
        for child in active:
            child.kill("validation interrupted")

    def __enter__(self) -> ReferenceProber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(
        self,
        task: Task,
        model_seed: int,
        input_seeds: list[int],
        time_it: bool,
        alone: bool = False,
    ) -> Probe:
        """One sandboxed run; on a GPU it starts once its footprint is reserved, and with
        ``alone`` once nothing else runs there."""
        config = self.config
        child = self.children.acquire()
        with self._active_lock:
            self._active.add(child)
        probe = Probe(network=str(child.ready_info.get("network", "")))
        reservation = contextlib.ExitStack()
        try:
            session = SandboxSession(child, config.timeout_s, config.host_memory_bytes)
            admit = None
            if self.gpu_budget is not None:
                admit = functools.partial(self._admit, reservation, alone)
            self._run(session, task, model_seed, input_seeds, time_it, probe, admit)
        except ChildDied as exc:
            probe.failure = "reference_timeout" if exc.timed_out else "reference_crashes"
            tail = child.output_tail(400).strip()
            probe.detail = f"the reference's process {exc}" + (
                f"; last output: {tail}" if tail else ""
            )
        except (KeyError, TypeError, ValueError, OSError, RuntimeError, EOFError) as exc:
            probe.failure = "unreadable_outputs"
            probe.detail = f"the sandbox reported unreadable results ({type(exc).__name__}: {exc})"
        finally:
            with self._active_lock:
                self._active.discard(child)
            child.close()
            reservation.close()
        budget = config.max_runtime_ms
        if (
            probe.failure is None
            and budget is not None
            and probe.runtime_ms is not None
            and probe.runtime_ms > budget
        ):
            probe.failure = "too_slow"
            probe.detail = f"median runtime {probe.runtime_ms:.3f} ms on {self.device_name} exceeds the budget of {budget:g} ms"
        return probe

    def _admit(
        self, reservation: contextlib.ExitStack, alone: bool, footprint: dict[str, Any]
    ) -> dict[str, int]:
        """Reserve the GPU memory a run reports it needs (all of it when the child could not
        measure, or when the run must be alone) and hold it until the run ends. A large task is
        timed on one placement of its inputs, as in the evaluator: four copies of an 8 GiB
        input are not in its plan."""
        budget = self.gpu_budget
        assert budget is not None
        admitted: dict[str, int] = {}
        if "error" in footprint:
            nbytes = budget.capacity
            admitted["timing_placements"] = 1
        else:
            plan = plan_for(
                int(footprint["input_bytes"]),
                int(footprint["param_bytes"]),
                int(footprint["output_bytes"]),
            )
            nbytes = budget.capacity if alone else plan.child_bytes
            if plan.large:
                admitted["timing_placements"] = 1
        reservation.enter_context(budget.reserve(nbytes))
        return {"bytes": nbytes, **admitted}

    def _run(
        self,
        session: SandboxSession,
        task: Task,
        model_seed: int,
        input_seeds: list[int],
        time_it: bool,
        probe: Probe,
        admit: Callable[[dict[str, Any]], dict[str, int]] | None,
    ) -> None:
        config = self.config
        loaded = session.start(
            {
                "device": "cpu" if self.kind == "cpu" else "cuda:0",
                "backend": task.backend,
                "task_source": task.source,
                # No derived CPU sizes: deriving runs the task's code here, outside the sandbox,
                # and a corpus record is not trusted yet.
                "size_overrides": task.size_overrides(self.kind, derive=False),
                **reference_as_solution(),
                "model_seed": model_seed,
                # Outputs are sampled in the sandbox: the whole of a 6 GiB output would cross
                # the socket twice per record for the 8 MiB that two runs are compared on.
                "sample_outputs": SAMPLED_VALUES,
                "timing": asdict(config.timing),
                "profile_calls": 1,
                "limits": {
                    "file_bytes": 4 * 2**30,
                    "cpu_seconds": int(config.timeout_s * 2) + 30,
                    "address_space_bytes": config.host_memory_bytes,
                    "gpu_memory_fraction": 0.9,
                },
            },
            admit,
        )
        if self._failed(loaded, probe, loading=True):
            return
        for seed in input_seeds:
            session.send_call(seed)
            report = session.receive()
            if self._failed(report, probe, loading=False):
                return
            if report["type"] != "outputs":
                raise ValueError(f"unexpected message {report['type']!r}")
            for name, count in report.get("compute_ops", {}).items():
                probe.aten_ops[str(name)] = probe.aten_ops.get(str(name), 0) + int(count)
            probe.flags = sorted(set(probe.flags) | {str(f) for f in report.get("flags", [])})
            digester = _Digester(report["outputs"])
            session.read_tensors(report["outputs"], digester.add)
            probe.outputs.append(digester.finish())
            probe.phase.update(report.get("phase", {}))
        if not time_it:
            return
        lock = self.gpu_lock if self.kind == "cuda" else _NO_LOCK
        with lock:
            session.send_time(input_seeds[0])
            timing = session.receive()
        if self._failed(timing, probe, loading=False):
            return
        probe.phase.update(timing.get("phase", {}))
        probe.runtime_ms = float(timing["runtime"]["median_ms"])
        # On a GPU the child names the aten ops from the profiled timing calls too.
        profiled = (timing.get("profile") or {}).get("aten_ops") or {}
        if profiled and not probe.aten_ops:
            probe.aten_ops = {str(k): int(v) for k, v in profiled.items()}

    @staticmethod
    def _failed(message: dict[str, Any], probe: Probe, loading: bool) -> bool:
        if message["type"] != "error":
            return False
        stage = message.get("stage")
        if stage == "harness":
            probe.failure = "harness_error"
        elif loading and stage in ("compile", "task"):
            probe.failure = "reference_does_not_load"
        else:
            probe.failure = "reference_crashes"
        error = str(message.get("error", ""))
        probe.out_of_memory = "out of memory" in error.lower()
        probe.detail = error[-600:]
        return True


class _NullLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NO_LOCK = _NullLock()


def seeds_for(task: Task, config: ValidateConfig) -> tuple[int, list[int]]:
    """Seeds derived from the curation seed and the task's content: reproducible runs."""
    base = int(task.hash[:8], 16) ^ (config.seed * 0x9E3779B1)
    model_seed = base % (2**31)
    return model_seed, [(base + 7919 * (k + 1)) % (2**31) for k in range(config.num_input_sets)]


def _non_finite(outputs: list[list[OutputDigest]]) -> str | None:
    for set_index, values in enumerate(outputs):
        for k, digest in enumerate(values):
            if digest.non_finite:
                numel = math.prod(digest.shape)
                return f"input set {set_index}, output {k}: {digest.non_finite}/{numel} values are NaN or Inf"
    return None


def _same(a: list[OutputDigest], b: list[OutputDigest]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x.is_tensor != y.is_tensor or (x.shape, x.dtype) != (y.shape, y.dtype):
            return False
        if x.is_tensor and not torch.equal(x.sample, y.sample):
            return False
        if not x.is_tensor and x.value != y.value:
            return False
    return True


def _disagreement(
    task: Task, a: list[OutputDigest], b: list[OutputDigest], index: int
) -> tuple[str | None, float]:
    """Where two runs of one input set differ beyond the task's tolerances (sampled values)."""
    if len(a) != len(b):
        return f"input set {index}: {len(a)} vs {len(b)} outputs", 0.0
    worst = 0.0
    for k, (x, y) in enumerate(zip(a, b, strict=True)):
        if (x.shape, x.dtype, x.is_tensor) != (y.shape, y.dtype, y.is_tensor):
            return f"input set {index}, output {k}: shape or type differs", worst
        if not x.is_tensor:
            if x.value != y.value:
                return f"input set {index}, output {k}: {x.value!r} vs {y.value!r}", worst
            continue
        atol, rtol = task.tolerances(x.dtype)
        both_finite = torch.isfinite(x.sample) & torch.isfinite(y.sample)
        diff = torch.where(both_finite, (x.sample - y.sample).abs(), 0.0)
        if diff.numel():
            worst = max(worst, float(diff.max()))
        bad = (diff > atol + rtol * y.sample.abs().nan_to_num()) | (
            ~both_finite & ~(x.sample.isnan() & y.sample.isnan()) & (x.sample != y.sample)
        )
        if bool(bad.any()):
            return (
                f"input set {index}, output {k}: {int(bad.sum())} of {bad.numel()} sampled "
                f"values differ beyond atol={atol:g}, rtol={rtol:g}"
            ), worst
    return None, worst


def judge(
    task: Task, first: Probe, second: Probe, config: ValidateConfig
) -> tuple[str | None, str, dict[str, Any]]:
    """(removal reason or None, detail, validation details) from two runs with equal seeds."""
    for probe in (first, second):
        if probe.failure:
            return probe.failure, probe.detail, {}
    if not any(digest.is_tensor for values in first.outputs for digest in values):
        return "no_tensor_output", "forward returned no tensor", {}
    bad = _non_finite(first.outputs)
    if bad:
        return "non_finite_output", bad, {}
    if "input_mutated" in first.flags:
        return (
            "mutates_inputs",
            "forward changed its inputs in place; a solution doing the same fails input_mutated",
            {},
        )
    max_diff = 0.0
    for index, (a, b) in enumerate(zip(first.outputs, second.outputs, strict=False)):
        problem, diff = _disagreement(task, a, b, index)
        max_diff = max(max_diff, diff)
        if problem:
            detail = "two runs with equal seeds disagree beyond the task's tolerances: " + problem
            return "nondeterministic", detail, {}
    if (
        config.reject_constant_outputs
        and len(first.outputs) >= 2
        and _same(first.outputs[0], first.outputs[1])
    ):
        return (
            "constant_output",
            "different inputs gave identical outputs: the output does not depend on the inputs",
            {},
        )
    details = {
        "runs": 2,
        "input_sets": len(first.outputs),
        "input_sets_repeated": len(second.outputs),
        "max_abs_diff_between_runs": max_diff,
        "flags": sorted(set(first.flags)),
        "network": first.network,
        "phase_seconds": {k: round(v, 4) for k, v in first.phase.items()},
    }
    return None, "", details


def validate_tasks(
    tasks: Dataset,
    config: ValidateConfig | None = None,
    console: Console | None = None,
    journal: Journal | None = None,
) -> tuple[Dataset, StepReport]:
    """Keep the tasks whose references pass (see the module docstring); add runtime and ops.

    With a ``journal`` (``resume.Journal`` keyed by this config), each task's verdict is
    appended as soon as both of its runs are judged, and tasks already in the journal are not
    run again: an interrupted validation resumes where it stopped. Progress goes to
    ``console`` as a bar, one step per task.
    """
    config = config or ValidateConfig()
    report = StepReport("validate", count_in=len(tasks))
    rows = list(tasks)
    task_list = [task_from_row(row) for row in rows]
    verdicts: dict[int, dict[str, Any]] = {}
    for index, task in enumerate(task_list):
        entry = journal.get(task.hash) if journal is not None else None
        if entry is not None:
            verdicts[index] = entry
    todo = [i for i in range(len(rows)) if i not in verdicts]
    if verdicts:
        report.notes["resumed_from_journal"] = len(verdicts)
    with (
        timed(report),
        ReferenceProber(config) as prober,
        step_progress(console, "validate", len(rows), completed=len(verdicts)) as progress,
    ):
        executor = ThreadPoolExecutor(max_workers=max(config.workers, 1))
        pending: dict[Future[Probe], tuple[int, int]] = {}
        probes: dict[int, list[Probe | None]] = {}
        rerun_alone: set[int] = set()

        def submit(index: int, alone: bool) -> None:
            task = task_list[index]
            model_seed, input_seeds = seeds_for(task, config)
            probes[index] = [None, None]
            # The second run repeats every input set but skips timing and the profiled call
            # (seconds on CPU). All of them: a reference drawing one of 64 channels from an
            # unseeded RNG agreed with itself on one input set in 1 of 64 validations.
            for which, time_it in ((0, True), (1, False)):
                future = executor.submit(prober.run, task, model_seed, input_seeds, time_it, alone)
                pending[future] = (index, which)

        try:
            for index in todo:
                submit(index, alone=False)
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    index, which = pending.pop(future)
                    probes[index][which] = future.result()
                    first, second = probes[index]
                    if first is None or second is None:
                        continue
                    if index not in rerun_alone and _ours(first, second, prober.kind):
                        # Our failure, or out of memory beside other runs: once more, alone.
                        rerun_alone.add(index)
                        submit(index, alone=True)
                        continue
                    verdicts[index] = _verdict(task_list[index], first, second, config, prober)
                    if journal is not None and verdicts[index].get("reason") != "harness_error":
                        journal.add(task_list[index].hash, rows[index]["id"], verdicts[index])
                    del probes[index]
                    progress.advance()
        except BaseException:
            # Ctrl-C (or a failure of ours): runs not started are cancelled, runs in flight are
            # killed; verdicts already journaled are kept.
            executor.shutdown(wait=False, cancel_futures=True)
            prober.interrupt()
            raise
        finally:
            executor.shutdown(wait=True, cancel_futures=True)
        if rerun_alone:
            report.notes["rerun_alone"] = len(rerun_alone)
        report.notes["device"] = prober.device_name
    kept: list[dict[str, Any]] = []
    for index, row in enumerate(rows):
        verdict = verdicts[index]
        if verdict.get("reason"):
            report.remove(row["id"], verdict["reason"], verdict.get("detail", ""))
        else:
            kept.append({**row, "validated": True, **verdict["fields"]})
    result = make_dataset(kept, "tasks")
    report.count_out = len(result)
    log_step(report, console)
    return result, report


def _ours(first: Probe, second: Probe, kind: str) -> bool:
    """Whether a failed pair of runs may not be the reference's fault: a harness error, or a
    GPU out-of-memory error while other runs shared the device."""
    for probe in (first, second):
        if probe.failure == "harness_error":
            return True
        if kind == "cuda" and probe.out_of_memory:
            return True
    return False


def _verdict(
    task: Task, first: Probe, second: Probe, config: ValidateConfig, prober: ReferenceProber
) -> dict[str, Any]:
    """A task's validation outcome as JSON (what the journal keeps)."""
    reason, detail, details = judge(task, first, second, config)
    if reason:
        return {"reason": reason, "detail": detail}
    model_seed, input_seeds = seeds_for(task, config)
    details.update(device=prober.kind, model_seed=model_seed, input_seeds=input_seeds)
    return {
        "fields": {
            "ref_device": prober.device_name,
            "ref_runtime_ms": first.runtime_ms,
            "aten_ops": sorted(first.aten_ops),
            "validation": json.dumps(details, sort_keys=True),
        }
    }
