"""Validate task references by running them, sandboxed, through the environment's machinery.

Why a sandboxed child and not the evaluator: inside the environment a reference is trusted
(it comes from our task suite) and runs in the worker process. A record of a corpus being
curated is not trusted yet; running it in the curation process would let any record read
files, open sockets or crash the run. The evaluator cannot run a reference for us either: it
computes references in its own process, and the task's ``Model`` posing as a solution would
fail the static checks ("no custom kernel"), which exist for solutions, not references.

So this step talks to the environment's sandbox directly (``kernelrl.env.sandbox.ChildPool``):
each run is a fresh child with an empty network namespace, a private scratch directory, a
scrubbed environment, CPU/memory/file-size limits and a wall-clock deadline. The job it gets is
the ordinary evaluation job with the reference posing as the solution
(``from kernelrl_task import Model as ModelNew``): the child builds the model from the task's
``get_init_inputs`` under a seed, makes inputs under seeds, runs forward, reports the aten ops
it dispatched, and, when asked, times it with the environment's timing procedure. Outputs come
back through files read with ``torch.load(weights_only=True)``, as in the evaluator.

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

import json
import pickle
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from datasets import Dataset
from rich.console import Console

from kernelrl.data.curate.report import StepReport, log_step, timed
from kernelrl.data.schema import make_dataset, task_of
from kernelrl.env.compare import compare_outputs
from kernelrl.env.evaluator import resolve_device
from kernelrl.env.reference import device_name
from kernelrl.env.sandbox import Child, ChildDied, ChildPool
from kernelrl.env.sandbox_child import TASK_MODULE
from kernelrl.env.task import Task
from kernelrl.env.timing import TimingConfig

REFERENCE_AS_SOLUTION = f"from {TASK_MODULE} import Model as ModelNew\n"


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


@dataclass
class Probe:
    """What one sandboxed run of a reference reported."""

    failure: str | None = None  # a removal reason when the run failed
    detail: str = ""
    outputs: list[list[Any]] = field(default_factory=list)
    runtime_ms: float | None = None
    aten_ops: dict[str, int] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)
    phase: dict[str, float] = field(default_factory=dict)
    network: str = ""


class ReferenceProber:
    """Runs references in sandboxed children; thread-safe, one child per run."""

    def __init__(self, config: ValidateConfig) -> None:
        self.config = config
        self.kind = config.resolved_device()
        gpu = config.gpu_index if self.kind == "cuda" else None
        self.children = ChildPool(self.kind, gpu, spare=max(config.workers, 1))
        self.gpu_lock = threading.Lock()
        self.device_name = device_name(
            torch.device("cuda", config.gpu_index) if self.kind == "cuda" else torch.device("cpu")
        )

    def close(self) -> None:
        self.children.close()

    def __enter__(self) -> ReferenceProber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, task: Task, model_seed: int, input_seeds: list[int], time_it: bool) -> Probe:
        config = self.config
        child = self.children.acquire()
        probe = Probe(network=str(child.ready_info.get("network", "")))
        try:
            self._run(child, task, model_seed, input_seeds, time_it, probe)
        except ChildDied as exc:
            probe.failure = "reference_timeout" if exc.timed_out else "reference_crashes"
            tail = child.output_tail(400).strip()
            probe.detail = f"the reference's process {exc}" + (
                f"; last output: {tail}" if tail else ""
            )
        except (
            KeyError,
            TypeError,
            ValueError,
            OSError,
            RuntimeError,
            EOFError,
            pickle.UnpicklingError,
        ) as exc:
            probe.failure = "unreadable_outputs"
            probe.detail = f"the sandbox reported unreadable results ({type(exc).__name__}: {exc})"
        finally:
            child.close()
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

    def _run(
        self,
        child: Child,
        task: Task,
        model_seed: int,
        input_seeds: list[int],
        time_it: bool,
        probe: Probe,
    ) -> None:
        config = self.config
        deadline = time.monotonic() + config.timeout_s
        child.send(
            {
                "type": "job",
                "device": "cpu" if self.kind == "cpu" else "cuda:0",
                "backend": task.backend,
                "task_source": task.source,
                "size_overrides": task.size_overrides(self.kind),
                "solution_source": REFERENCE_AS_SOLUTION,
                "model_seed": model_seed,
                "input_seeds": input_seeds,
                "timing": asdict(config.timing),
                "profile_calls": 1,
                "limits": {
                    "file_bytes": 4 * 2**30,
                    "cpu_seconds": int(config.timeout_s * 2) + 30,
                    "address_space_bytes": config.host_memory_bytes,
                    "gpu_memory_fraction": 0.9,
                },
            }
        )
        report = child.receive(deadline, config.host_memory_bytes)
        probe.phase.update(report.get("phase", {}))
        if report["type"] == "error":
            stage = report.get("stage")
            probe.failure = (
                "reference_does_not_load"
                if stage in ("harness", "compile")
                else "reference_crashes"
            )
            probe.detail = str(report.get("error", ""))[-600:]
            return
        if report["type"] != "outputs":
            raise ValueError(f"unexpected message {report['type']!r}")
        probe.aten_ops = {str(k): int(v) for k, v in report.get("aten_ops", {}).items()}
        probe.flags = [str(f) for f in report.get("flags", [])]
        probe.outputs = [
            torch.load(child.scratch / f"outputs_{index}.pt", weights_only=True, map_location="cpu")
            for index in range(len(input_seeds))
        ]
        if not time_it:
            return
        lock = self.gpu_lock if self.kind == "cuda" else _NO_LOCK
        with lock:
            child.send({"type": "time"})
            timing = child.receive(deadline, config.host_memory_bytes)
        if timing["type"] == "error":
            probe.failure = "reference_crashes"
            probe.detail = str(timing.get("error", ""))[-600:]
            return
        probe.phase.update(timing.get("phase", {}))
        probe.runtime_ms = float(timing["runtime"]["median_ms"])
        # On a GPU the child names the aten ops from the profiled timing calls, not before.
        profiled = (timing.get("profile") or {}).get("aten_ops") or {}
        if profiled and not probe.aten_ops:
            probe.aten_ops = {str(k): int(v) for k, v in profiled.items()}


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


def _non_finite(outputs: list[list[Any]]) -> str | None:
    for set_index, values in enumerate(outputs):
        for k, value in enumerate(values):
            if isinstance(value, torch.Tensor) and (
                value.is_floating_point() or value.is_complex()
            ):
                bad = ~torch.isfinite(value)
                if bool(bad.any()):
                    return f"input set {set_index}, output {k}: {int(bad.sum())}/{value.numel()} values are NaN or Inf"
    return None


def _same(a: list[Any], b: list[Any]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x, y):
                return False
        elif x != y:
            return False
    return True


def judge(
    task: Task, first: Probe, second: Probe, config: ValidateConfig
) -> tuple[str | None, str, dict[str, Any]]:
    """(removal reason or None, detail, validation details) from two runs with equal seeds."""
    for probe in (first, second):
        if probe.failure:
            return probe.failure, probe.detail, {}
    if not any(isinstance(v, torch.Tensor) for values in first.outputs for v in values):
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
        comparison = compare_outputs(task, b, a, index)
        max_diff = max(max_diff, comparison.max_abs_err)
        if not comparison.correct:
            detail = (
                "two runs with equal seeds disagree beyond the task's tolerances: "
                + "; ".join(comparison.problems[:2])
            )
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
    tasks: Dataset, config: ValidateConfig | None = None, console: Console | None = None
) -> tuple[Dataset, StepReport]:
    """Keep the tasks whose references pass (see the module docstring); add runtime and ops."""
    config = config or ValidateConfig()
    report = StepReport("validate", count_in=len(tasks))
    rows = list(tasks)
    kept: list[dict[str, Any]] = []
    with timed(report), ReferenceProber(config) as prober:
        task_list = [task_of(row) for row in rows]
        jobs = []
        with ThreadPoolExecutor(max_workers=max(config.workers, 1)) as executor:
            for task in task_list:
                model_seed, input_seeds = seeds_for(task, config)
                # The second run repeats every input set but skips timing and the profiled call
                # (seconds on CPU). All of them: a reference drawing one of 64 channels from an
                # unseeded RNG agreed with itself on one input set in 1 of 64 validations.
                jobs.append(
                    (
                        executor.submit(prober.run, task, model_seed, input_seeds, True),
                        executor.submit(prober.run, task, model_seed, input_seeds, False),
                    )
                )
            for row, task, (first_future, second_future) in zip(rows, task_list, jobs, strict=True):
                first, second = first_future.result(), second_future.result()
                reason, detail, details = judge(task, first, second, config)
                if reason:
                    report.remove(row["id"], reason, detail)
                    continue
                model_seed, input_seeds = seeds_for(task, config)
                details.update(device=prober.kind, model_seed=model_seed, input_seeds=input_seeds)
                kept.append(
                    {
                        **row,
                        "validated": True,
                        "ref_device": prober.device_name,
                        "ref_runtime_ms": first.runtime_ms,
                        "aten_ops": sorted(first.aten_ops),
                        "validation": json.dumps(details, sort_keys=True),
                    }
                )
        report.notes["device"] = prober.device_name
    result = make_dataset(kept, "tasks")
    report.count_out = len(result)
    log_step(report, console)
    return result, report
