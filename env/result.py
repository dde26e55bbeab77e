"""EvalResult: the one record every part of kernelrl reads (rewards, sweeps, curation)."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

SCHEMA_VERSION = 1
# EvalResult.sandbox key of a verdict a pool gave itself (a worker lost, a batch deadline, a
# closed pool), naming why: such results are stored like any other but never served from a
# results cache (``kernelrl.env.store.is_cacheable``).
POOL_ERROR_KEY = "pool_error"


class Status(StrEnum):
    """Verdict of one evaluation, from the earliest stage that failed.

    ``not_run`` is for solutions that passed every check that the device allows but could not be
    executed there (CUDA C++ on a machine without a GPU): it is never mistaken for ``correct``.

    ``harness_error`` is *ours*, never the solution's: the trusted side or the harness code in the
    sandbox failed (serialisation, a limit we set, a CUDA context, a bug of kernelrl). It says
    nothing about the solution, so pools retry it once, reports count it apart, and training
    leaves it unscored (no reward, no advantage) rather than scoring it 0.
    """

    FORMAT_ERROR = "format_error"
    INTEGRITY_VIOLATION = "integrity_violation"
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    INCORRECT = "incorrect"
    CORRECT = "correct"
    NOT_RUN = "not_run"
    HARNESS_ERROR = "harness_error"


@dataclass
class TimingStats:
    """Robust summary of repeated measurements, in milliseconds."""

    median_ms: float
    p25_ms: float
    p75_ms: float
    min_ms: float
    max_ms: float
    reps: int
    rel_err: float  # relative standard error of the median estimate
    # Each input set's own median, in the order timed (the median above is their mean): whether
    # a kernel's time moves with where its buffers lie, apart from between evaluations.
    placement_medians_ms: list[float] = field(default_factory=list)

    @classmethod
    def from_report(cls, report: Any, most_placements: int) -> TimingStats:
        """A sandbox's timing report, read field by field: finite, the medians positive, at most
        ``most_placements`` of them. A report that is not is the sandbox's (``ValueError``)."""
        names = ("median_ms", "p25_ms", "p75_ms", "min_ms", "max_ms", "rel_err")
        values = {name: float(report[name]) for name in names}
        listed = report.get("placement_medians_ms", [])
        if not isinstance(listed, list):
            raise ValueError(f"placement medians must be a list, not {type(listed).__name__}")
        placed = [float(v) for v in listed]
        if len(placed) > most_placements:
            raise ValueError(f"{len(placed)} placements reported, at most {most_placements} timed")
        medians = [values["median_ms"], *placed]
        if not all(math.isfinite(v) for v in [*values.values(), *placed]) or min(medians) <= 0:
            raise ValueError(f"implausible timing {values} {placed}")
        return cls(reps=int(report["reps"]), placement_medians_ms=placed, **values)

    @property
    def spread(self) -> float:
        """Inter-quartile range relative to the median."""
        return (self.p75_ms - self.p25_ms) / self.median_ms if self.median_ms > 0 else 0.0


@dataclass
class EvalResult:
    """The verdict on one solution. ``status`` is always a ``Status``, never its string: the
    string is converted where results are read back (``from_dict``, from JSON and stores), and
    the constructor refuses anything else, so readers compare with ``is`` and never convert."""

    task_id: str
    backend: str
    status: Status
    feedback: str = ""
    error: str = ""
    checks_failed: list[str] = field(default_factory=list)
    device: str = "cpu"
    device_name: str = ""
    # correctness
    input_sets_checked: int = 0
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    # timing
    timing_meaningful: bool = False
    runtime: TimingStats | None = None
    ref_eager: TimingStats | None = None
    ref_compile: TimingStats | None = None
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    # profiling
    own_kernel_share: float | None = None  # share of GPU time in the solution's own kernels
    custom_kernel_launches: int | None = None  # own kernel launches per forward call
    kernels: list[dict[str, Any]] = field(default_factory=list)  # name, calls, total_us, own
    # bookkeeping
    phase_seconds: dict[str, float] = field(default_factory=dict)
    sandbox: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    task_hash: str = ""
    solution_hash: str = ""
    timestamp: float = 0.0
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if not isinstance(self.status, Status):
            raise TypeError(
                f"EvalResult.status must be a Status, got {self.status!r}; read stored results "
                "with EvalResult.from_dict"
            )

    @property
    def correct(self) -> bool:
        return self.status is Status.CORRECT

    @property
    def scored(self) -> bool:
        """``is_scored(self)``."""
        return is_scored(self)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["status"] = str(self.status)
        data["correct"] = self.correct
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvalResult:
        data = dict(data)
        data.pop("correct", None)
        version = data.get("schema_version", SCHEMA_VERSION)
        if version > SCHEMA_VERSION:
            raise ValueError(
                f"EvalResult schema {version} is newer than this kernelrl ({SCHEMA_VERSION})"
            )
        data["status"] = Status(data["status"])
        for name in ("runtime", "ref_eager", "ref_compile"):
            if data.get(name) is not None:
                data[name] = TimingStats(**data[name])
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def is_scored(result: EvalResult | None) -> bool:
    """Whether a result carries a verdict on the solution: the one definition of "scored".
    False for None (no evaluation came back) and for ``harness_error`` (our harness failed):
    such a result gets no reward, stays out of every rate and is never cached."""
    return result is not None and result.status is not Status.HARNESS_ERROR
