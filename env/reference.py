"""The trusted side of a task: reference outputs and reference timings.

Reference code comes from the task, never from a model, so a trusted task's runs in the worker.
An untrusted task's (a client's) never does: ``ReferenceRunner`` refuses it, and its reference
runs in the sandbox (env/sandboxed_reference.py). Timings (eager and torch.compile) are expensive
and stable, so they are cached on disk per task x size variant x device x library versions;
an untrusted task's timing is its own child's report and is never cached.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from kernelrl.env import sizes
from kernelrl.env.result import TimingStats
from kernelrl.env.sandbox import harness
from kernelrl.env.task import Task, TaskError, require_trusted
from kernelrl.env.timing import (
    TimingConfig,
    placements,
    time_placement,
    time_sets,
)


def library_versions() -> dict[str, str]:
    import triton

    import kernelrl

    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "kernelrl": kernelrl.__version__,
    }
    if torch.version.cuda:
        versions["cuda"] = torch.version.cuda
    return versions


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"


# The reference's timings, in the order an evaluation takes them.
REFERENCE_KINDS = ("eager", "compile")


class ReferenceRunner:
    """Runs trusted tasks' references in this process; one module per task and size variant.
    Every call loads the task through ``module``, which refuses an untrusted task."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        # Exact fp32 references: cuDNN convolutions default to TF32, whose ~1e-3 relative error
        # would both blur correctness and time a less precise baseline than the tolerance asks.
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        self._modules: dict[tuple[str, str], types.ModuleType] = {}
        self._init_compute: dict[str, frozenset[str]] = {}
        self._lock = threading.Lock()

    def module(self, task: Task) -> types.ModuleType:
        require_trusted(task, "loading its reference in the worker")
        kind = harness.device_kind(self.device)
        key = (task.hash, kind)
        with self._lock:
            if key not in self._modules:
                overrides = sizes.size_overrides(task, kind)  # a TaskError of its own, said once
                try:
                    self._modules[key] = harness.load_module(
                        task.source, f"kernelrl_reference_{task.hash}_{kind}", overrides
                    )
                except Exception as exc:
                    raise TaskError(
                        f"task {task.id}: reference does not load: {type(exc).__name__}: {exc}"
                    ) from exc
            return self._modules[key]

    def model(self, task: Task, model_seed: int) -> torch.nn.Module:
        """The task's Model with the parameters the solution's ModelNew gets from the same seed."""
        module = self.module(task)
        try:
            return harness.build_model(module.Model, module, model_seed, self.device)
        except Exception as exc:
            raise TaskError(
                f"task {task.id}: reference fails to build: {type(exc).__name__}: {exc}"
            ) from exc

    def init_compute(self, task: Task) -> frozenset[str]:
        """The compute ops (aten, outside the glue vocabulary) that building the task's own
        Model dispatches: parameter initialisation (``uniform_``, ``normal_``...) and whatever
        else the task defines at construction. A solution's constructor may do the same and
        no more; computing anything else there is work done where no call is checked."""
        if task.hash not in self._init_compute:
            from kernelrl.env.integrity.audit import AtenAudit, LaunchCounter

            audit = AtenAudit(LaunchCounter())
            with audit:
                self.model(task, 0)
            self._init_compute[task.hash] = frozenset(audit.compute)
        return self._init_compute[task.hash]

    def output(self, task: Task, model: torch.nn.Module, seed: int) -> list[Any]:
        """The reference outputs of one input set, made here from ``seed``: its inputs are let
        go once they are, so the trusted side holds one set's inputs and the outputs the
        evaluation keeps (``MemoryPlan.outputs_ahead``)."""
        module = self.module(task)
        try:
            inputs = harness.make_inputs(module, seed, self.device)
            with torch.no_grad():
                return harness.as_output_list(model(*inputs))
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:
            raise TaskError(
                f"task {task.id}: reference fails to run: {type(exc).__name__}: {exc}"
            ) from exc

    def outputs(self, task: Task, model_seed: int, input_seeds: list[int]) -> list[list[Any]]:
        model = self.model(task, model_seed)
        return [self.output(task, model, seed) for seed in input_seeds]

    def timers(
        self, task: Task, config: TimingConfig, kinds: tuple[str, ...] = REFERENCE_KINDS
    ) -> dict[str, PlacementTimer | None]:
        """The reference ready to be timed one input set at a time as each of ``kinds``
        ("eager", "compile"): one model and one set of inputs, which torch.compile wraps and
        shares, as many sets as the solution is timed on. torch.compile's compilation runs
        here (its first call), so that timing is timing only; a kind is None where the
        reference does not compile."""
        unknown = set(kinds) - set(REFERENCE_KINDS)
        if unknown:
            raise ValueError(f"unknown reference timing kinds {sorted(unknown)}")
        module = self.module(task)
        model = harness.build_model(module.Model, module, 0, self.device)
        inputs = harness.TimedInputs(
            lambda seed: harness.make_inputs(module, seed, self.device),
            1,
            placements(self.device, config),
        )
        timers: dict[str, PlacementTimer | None] = {}
        for kind in kinds:
            timers[kind] = (
                _compiled_timer(model, inputs, self.device, config)
                if kind == "compile"
                else PlacementTimer(model, inputs, self.device, config)
            )
        return timers

    def time(self, task: Task, compiled: bool, config: TimingConfig) -> TimingStats | None:
        """Every input set timed, one after another."""
        kind = "compile" if compiled else "eager"
        timer = self.timers(task, config, (kind,))[kind]
        return None if timer is None else timer.time_all()


@dataclass
class PlacementTimer:
    """A reference timed one input set at a time, by the solution's procedure
    (``timing.time_placement``): the trusted side can take its turns between the solution's."""

    model: Callable[..., Any]
    inputs: harness.TimedInputs
    device: torch.device
    config: TimingConfig

    @property
    def count(self) -> int:
        """Input sets made: fewer than asked where the GPU had no room for more."""
        return len(self.inputs.sets)

    def time(self, index: int) -> TimingStats:
        """Turn ``index``, on input set ``index`` (modulo the sets made)."""
        placed = index % self.count
        call = harness.forward_call(self.model, self.inputs.sets, placed)
        refresh = partial(self.inputs.refresh, placed) if self.config.fresh_inputs else None
        return time_placement(call, self.device, self.config, index, prepare=refresh)

    def time_all(self) -> TimingStats:
        """The input sets timed one after another, as many as the solution's would be."""
        return time_sets(self.time, self.count, self.config)


def _compiled_timer(
    model: torch.nn.Module, inputs: harness.TimedInputs, device: torch.device, config: TimingConfig
) -> PlacementTimer | None:
    """``model`` under torch.compile, compiled by a first call, or None where it does not
    compile (no torch.compile baseline then)."""
    try:
        compiled = torch.compile(model)
        with torch.no_grad():
            compiled(*inputs.sets[0])
    except Exception:
        return None
    return PlacementTimer(compiled, inputs, device, config)


# How a cached timing was made, in its key: since 2, with every sandbox paused and the GPU found
# running nothing of theirs (``gpu_quiet``); since 3, their copies through memory looked for
# too. Entries made before could hold a sandbox's work.
TIMED_ALONE_PROCEDURE = "timed-alone-3"


class ReferenceTimingCache:
    """JSON file of reference timings; one writer per process, atomic replace on save."""

    def __init__(self, path: Path | None = None) -> None:
        cache_home = Path(os.environ.get("KERNELRL_CACHE", Path.home() / ".cache" / "kernelrl"))
        self.path = path or cache_home / "reference_timings.json"
        self._lock = threading.Lock()
        self._entries: dict[str, Any] | None = None

    @staticmethod
    def key(task: Task, device: torch.device, kind: str, timing: TimingConfig) -> str:
        """Per task source, size variant (a dataset row's ``sizes`` change what is timed),
        device, library versions, baseline kind and timing procedure. An untrusted task has
        no entry: its timing is its own child's report (the client's word), which no cache
        shared with other evaluations may keep."""
        require_trusted(task, "caching its reference timing")
        versions = library_versions()
        sizes = json.dumps(task.sizes, sort_keys=True, default=str)
        return "|".join(
            [
                task.hash,
                hashlib.sha256(sizes.encode()).hexdigest()[:12],
                harness.device_kind(device),
                device_name(device),
                versions["torch"],
                versions["triton"],
                kind,
                timing.fingerprint(),
                TIMED_ALONE_PROCEDURE,
            ]
        )

    def _load(self) -> dict[str, Any]:
        if self._entries is None:
            try:
                self._entries = json.loads(self.path.read_text())
            except (OSError, ValueError):
                self._entries = {}
        return self._entries

    def get(self, key: str) -> TimingStats | None | bool:
        """The cached stats, None for 'known to be unavailable', False for a miss."""
        with self._lock:
            entries = self._load()
            if key not in entries:
                return False
            value = entries[key]
            return TimingStats(**value) if value is not None else None

    def put(self, key: str, stats: TimingStats | None) -> None:
        with self._lock:
            self._entries = None  # re-read: another process may have added entries
            entries = self._load()
            entries[key] = stats.__dict__ if stats is not None else None
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(entries, indent=0, sort_keys=True))
            tmp.replace(self.path)
