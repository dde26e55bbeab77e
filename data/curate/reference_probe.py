"""Sandboxed runs of a task's reference: what one run reported (``Probe``).

Each run is a fresh child of the environment's sandbox (``kernelrl.env.sandbox.processes``):
an empty network namespace, a private scratch directory, a scrubbed environment,
CPU/memory/file-size limits and a wall-clock deadline. The job it gets is the ordinary
evaluation job with the reference posing as the solution (``from kernelrl_task import Model as
ModelNew``): the child builds the model from the task's ``get_init_inputs`` under a seed, makes
inputs under seeds, runs forward, reports the aten ops it dispatched, and, when asked, times it
with the environment's timing procedure. The child samples each output (every k-th value, at
most 2**20, and its count of non-finite values) and sends the sample through the session
(``kernelrl.env.sandbox.session``), so neither the socket nor host memory grows with a task's
tensor sizes.

On a GPU, a run starts only once the footprint the child measured (meta device, in the sandbox)
is reserved on the device (``kernelrl.env.admission``); with ``alone``, once nothing else runs
there. Whether two runs make a usable reference is ``verdict``'s call, not this module's.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from kernelrl.env.admission import GpuMemoryBudget, plan_for
from kernelrl.env.evaluator import resolve_device
from kernelrl.env.reference import device_name
from kernelrl.env.sandbox.child_process import Child, ChildDied
from kernelrl.env.sandbox.processes import ChildPool
from kernelrl.env.sandbox.session import SandboxSession, reference_as_solution
from kernelrl.env.task import Task

if TYPE_CHECKING:
    from kernelrl.data.curate.validate_config import ValidateConfig

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

    def __init__(self, config: ValidateConfig, device: str = "auto") -> None:
        self.config = config
        self.kind = resolve_device(device)
        gpu = config.gpu_index if self.kind == "cuda" else None
        self.children = ChildPool(self.kind, gpu, spare=max(config.validate_workers, 1))
        self.gpu_lock = threading.Lock()
        self._active: set[Child] = set()
        self._active_lock = threading.Lock()
        gpu_device = torch.device("cuda", config.gpu_index) if self.kind == "cuda" else None
        self.device_name = device_name(gpu_device or torch.device("cpu"))
        self.gpu_budget = (
            GpuMemoryBudget.for_device(gpu_device, warming=max(config.validate_workers, 1))
            if gpu_device is not None
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
            session = SandboxSession(child, config.validate_timeout_s, config.host_memory_bytes)
            admit = None
            if self.gpu_budget is not None:
                # The child's context is held from now; the admission takes the hold over.
                context = reservation.callback(self.gpu_budget.hold_context())
                admit = functools.partial(self._admit, reservation, alone, context)
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
        budget = config.max_ref_runtime_ms
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
        self,
        reservation: contextlib.ExitStack,
        alone: bool,
        context: Callable[[], None],
        footprint: dict[str, Any],
    ) -> dict[str, int]:
        """Reserve the GPU memory a run reports it needs (all of it when the child could not
        measure, or when the run must be alone) and hold it until the run ends. The run is
        timed on the input sets its plan counted, as in the evaluator: a large task on one
        (four copies of an 8 GiB input are not in its plan)."""
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
                self.config.timing,
            )
            nbytes = budget.capacity if alone else plan.child_bytes
            admitted["timing_placements"] = plan.placements
        reservation.enter_context(budget.reserve(nbytes, context))
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
                "size_overrides": task.size_overrides(self.kind),
                **reference_as_solution(),
                "model_seed": model_seed,
                # Outputs are sampled in the sandbox: the whole of a 6 GiB output would cross
                # the socket twice per record for the 8 MiB that two runs are compared on.
                "sample_outputs": SAMPLED_VALUES,
                "timing": asdict(config.timing),
                "profile_calls": 1,
                "limits": {
                    "file_bytes": 4 * 2**30,
                    "cpu_seconds": int(config.validate_timeout_s * 2) + 30,
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
        lock = self.gpu_lock if self.kind == "cuda" else contextlib.nullcontext()
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
