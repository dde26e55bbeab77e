"""Each task's speed-up spread over the repeats of a throughput run, beside what moved it: the
solution's runtime, the reference's (constant while cached) and the solution's input sets within
one evaluation (a placement's memory, apart from anything that differs between processes), and
the clocks the GPU ran at as each timing ended."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict

from kernelrl.env.result import EvalResult

# The most a task's speed-up may spread between evaluations (the throughput target).
SPREAD_TARGET = 1.03


def report_spreads(results: list[EvalResult]) -> dict[str, dict]:
    """Prints each task's speed-up spread over the repeats, beside its two sides' spreads and
    how far its input sets' medians lie apart within an evaluation; returns them with each
    task's median speed-up."""
    by_task = _timed_by_task(results)
    spreads = {t: _spread([r.speedup_vs_eager for r in v]) for t, v in by_task.items()}
    spreads = {t: s for t, s in spreads.items() if s is not None}
    # Which side moves: the solution's runtime, the reference's (constant when cached), or both
    # together (then their ratio moves less than either). Placements: the median over the
    # evaluations of each one's max/min between its input sets, what moves within a process.
    runtime_spreads = {t: _spread([r.runtime.median_ms for r in v]) for t, v in by_task.items()}
    reference_spreads = {t: _spread([r.ref_eager.median_ms for r in v]) for t, v in by_task.items()}
    placement_spreads = {t: _placement_spread(v) for t, v in by_task.items()}
    runtime_errors = {t: _runtime_error(v) for t, v in by_task.items()}
    speedups = {t: statistics.median(r.speedup_vs_eager for r in v) for t, v in by_task.items()}
    print(
        "speedup vs eager over repeats (max/min), the spreads of its two sides and within one, "
        "and the runtime's relative error as the evaluations said it and as seen between them:"
    )
    for task_id, rs in by_task.items():
        print(
            f"  {task_id:28s} median {speedups[task_id]:6.2f}x  "
            f"spread {spreads.get(task_id)}  runtime {runtime_spreads[task_id]}  "
            f"reference {reference_spreads[task_id]}  placements {placement_spreads[task_id]}  "
            f"error {runtime_errors[task_id]}  sets {_sets_timed(rs)}  (n={len(rs)})"
        )
    if spreads:
        over = sorted(t for t, s in spreads.items() if s > SPREAD_TARGET)
        print(
            f"speedup spread: median {statistics.median(spreads.values()):.3f}, "
            f"max {max(spreads.values()):.3f}; tasks over {SPREAD_TARGET}: {over or 'none'}"
        )
    # How many input sets the evaluations were timed on: the first few where they agree, more
    # where they lie apart, fewer where a task's memory plan allows fewer (one for a large task).
    sets_timed = Counter(len(r.runtime.placement_medians_ms) for v in by_task.values() for r in v)
    if sets_timed:
        print(f"input sets timed per evaluation: {dict(sorted(sets_timed.items()))}")
    return {
        "input_sets_timed": dict(sets_timed),
        "speedup_medians": speedups,  # what two runs' settings are compared on, task by task
        "spreads": spreads,
        "runtime_spreads": runtime_spreads,
        "reference_spreads": reference_spreads,
        "placement_spreads": placement_spreads,
        "runtime_errors": runtime_errors,
    }


def _timed_by_task(results: list[EvalResult]) -> dict[str, list[EvalResult]]:
    """The evaluations with a speed-up, by task, in the order given."""
    by_task: dict[str, list[EvalResult]] = defaultdict(list)
    for r in results:
        if r.speedup_vs_eager is not None and r.runtime and r.ref_eager:
            by_task[r.task_id].append(r)
    return by_task


def _sets_timed(results: list[EvalResult]) -> str:
    """The input sets an evaluation of the task was timed on: the range over its evaluations."""
    counts = [len(r.runtime.placement_medians_ms) for r in results]
    low, high = min(counts), max(counts)
    return str(low) if low == high else f"{low}-{high}"


def _runtime_error(results: list[EvalResult]) -> dict[str, float | None]:
    """What the evaluations said of their runtime's error (the median of their relative
    standard errors) beside what it was: the relative standard deviation of their medians.
    An estimate far under what is seen misstates how well one evaluation knows its speed-up."""
    medians = [r.runtime.median_ms for r in results]
    seen = statistics.stdev(medians) / statistics.mean(medians) if len(medians) > 1 else None
    said = statistics.median(r.runtime.rel_err for r in results)
    return {"said": round(said, 4), "seen": round(seen, 4) if seen is not None else None}


def _placement_spread(results: list[EvalResult]) -> float | None:
    """The median over evaluations of max/min between one evaluation's input-set medians."""
    within = [_spread(r.runtime.placement_medians_ms) for r in results if r.runtime]
    within = [s for s in within if s is not None]
    return round(statistics.median(within), 3) if within else None


def _spread(values: list[float]) -> float | None:
    """max/min, rounded to 3 places; None for fewer than two values."""
    return round(max(values) / min(values), 3) if len(values) > 1 else None


def report_spread_evaluations(
    results: list[EvalResult], limit: float = SPREAD_TARGET
) -> dict[str, list]:
    """Prints, for each task whose speed-up spread is over ``limit``, its evaluations in the
    order they started: where in the pass each began, its runtime against the task's median,
    the sets it timed and how far they lay apart, and the SM clock as its timing ended. A
    spread says two evaluations disagree; these say whether one lies off, and whether it is
    the first of a pass, one moment of the run or one process's draw. Returns them by task."""
    by_task = _timed_by_task(results)
    if not by_task:
        return {}
    first = min(r.timestamp for r in results)
    order = {id(r): i for i, r in enumerate(sorted(results, key=lambda r: r.timestamp))}
    found: dict[str, list] = {}
    for task_id, rs in sorted(by_task.items()):
        spread = _spread([r.speedup_vs_eager for r in rs])
        if spread is None or spread <= limit:
            continue
        median = statistics.median(r.runtime.median_ms for r in rs)
        found[task_id] = [
            {
                "started": order[id(r)],
                "started_s": round(r.timestamp - first, 2),
                "runtime_ms": r.runtime.median_ms,
                "of_median": round(r.runtime.median_ms / median, 4),
                "sets": len(r.runtime.placement_medians_ms),
                "sets_spread": _spread(r.runtime.placement_medians_ms),
                "sm_mhz": (r.sandbox.get("gpu_clocks") or {}).get("sm_mhz"),
            }
            for r in sorted(rs, key=lambda r: r.timestamp)
        ]
        print(f"  {task_id} (spread {spread}), its evaluations as they started:")
        for e in found[task_id]:
            print(
                f"    #{e['started']:<4d} at {e['started_s']:7.2f} s  runtime {e['runtime_ms']:.4f} ms"
                f" ({e['of_median']:.4f} of the median)  sets {e['sets']}"
                f" (max/min {e['sets_spread']})  SM {e['sm_mhz']} MHz"
            )
    return found


def report_clocks(results: list[EvalResult]) -> dict[str, object]:
    """Prints what the GPU ran at as each timing ended (``EvalResult.sandbox["gpu_clocks"]``):
    the SM clock's range, the temperature's, and how often each reason held the clocks down; a
    kernel bound by its SMs slows with their clock, whatever its memory. Empty without NVML."""
    read = [r.sandbox["gpu_clocks"] for r in results if r.sandbox.get("gpu_clocks")]
    if not read:
        return {}
    sm = sorted(c["sm_mhz"] for c in read)
    temperature = sorted(c["temperature_c"] for c in read)
    held_down = Counter(reason for c in read for reason in c["held_down"])
    print(
        f"GPU as each timing ended ({len(read)} evaluations): SM clock {sm[0]}-{sm[-1]} MHz "
        f"(median {statistics.median(sm)}), {temperature[0]}-{temperature[-1]} C; "
        f"held down: {dict(held_down) or 'never'}"
    )
    return {
        "sm_mhz": [sm[0], statistics.median(sm), sm[-1]],
        "temperature_c": [temperature[0], temperature[-1]],
        "held_down": dict(held_down),
    }
