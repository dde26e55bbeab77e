"""Sweep metrics, computed from SampleRecords alone (so reports can be rebuilt at any time).

Denominators: every *selected* task counts (KernelBench defines fast_p over all tasks). A task
with no scored attempt in a view (no solution, the pool could not evaluate it, only harness
errors, the sweep stopped first) is *not evaluated*: it counts as failed, with its planned
samples (at least one) as failed attempts in every rate and pass@k 0, and is listed with its
reason. ``harness_error`` attempts are kernelrl's failures, not the solution's: they are counted
apart (``harness_errors``) and left out of every rate and of pass@k's sample counts; a task
left with no other attempt is not evaluated (failed, listed) as above.

Definitions (one *attempt* is one scored EvalResult; rates are over the attempts of a view plus
the failed attempts of its not-evaluated tasks):

- parse rate: not ``format_error``;
- compile rate: the solution got past compilation: ``runtime_error``, ``timeout``,
  ``incorrect``, ``correct``, ``not_run``, or an integrity violation caught while it ran;
- correctness: ``correct``; integrity-violation rate: ``integrity_violation``;
- fast_p (KernelBench): share of attempts that are correct *and* faster than the baseline by
  more than a factor p (``speedup > p``); fast_0 is the correctness rate. Against eager PyTorch
  and against torch.compile. ``None`` (not 0) where nothing was timed: CPU runs have no
  meaningful timings;
- geometric-mean speedup over the correct attempts that have a speedup;
- pass@k: the unbiased estimator of Chen et al. (2021), 1 - C(n-c, k) / C(n, k) for a task with
  n scored samples of which c are correct, averaged over every selected task: a task with
  fewer than k scored samples counts its missing ones as failed (a lower bound), a task with
  none scores 0. ``None`` when k is above the samples any task was planned to get.

Intervals (``kernelrl.eval.estimators``): Wilson score intervals for rates (attempts treated as
independent trials), percentile bootstrap for pass@k (resampling tasks; Wilson over tasks where
every task scores exactly 0 or 1, where a bootstrap degenerates to ``[0, 0]`` or ``[1, 1]``) and
for the geometric mean (resampling attempts).

Views of a multi-turn sweep, each one attempt per (task, sample): ``last`` (the final turn),
``best`` (the best turn: correct and fastest first, then the furthest stage reached), and per
turn t the best attempt among turns <= t (what refinement has achieved by then).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from kernelrl.env.result import EvalResult, Status
from kernelrl.eval.estimators import (
    Estimate,
    StatsConfig,
    bootstrap_interval,
    geomean,
    mean,
    pass_at_k,
    pass_at_k_estimate,
    rate,
)
from kernelrl.eval.records import SampleRecord, SelectedTask

FAST_P = (0.0, 1.0, 1.2, 2.0)
BASELINES = ("eager", "compile")

# How far an attempt got, for choosing the best turn. An integrity violation ranks lowest of the
# solution's verdicts: a solution that games the checks is worse than one that fails honestly.
# A harness error is no verdict at all: any scored turn is a better pick.
STAGE_RANK = {
    Status.HARNESS_ERROR: -1,
    Status.INTEGRITY_VIOLATION: 0,
    Status.FORMAT_ERROR: 1,
    Status.COMPILE_ERROR: 2,
    Status.RUNTIME_ERROR: 3,
    Status.TIMEOUT: 3,
    Status.INCORRECT: 4,
    Status.NOT_RUN: 5,
    Status.CORRECT: 6,
}
_RAN = {Status.RUNTIME_ERROR, Status.TIMEOUT, Status.INCORRECT, Status.CORRECT, Status.NOT_RUN}


# ---------------------------------------------------------------------------------- attempts
def parsed(result: EvalResult) -> bool:
    return result.status is not Status.FORMAT_ERROR


def compiled(result: EvalResult) -> bool:
    if result.status is Status.INTEGRITY_VIOLATION:
        return result.input_sets_checked > 0  # caught by a dynamic check, after it ran
    return result.status in _RAN


def speedup(result: EvalResult, baseline: str) -> float | None:
    value = result.speedup_vs_eager if baseline == "eager" else result.speedup_vs_compile
    return value if result.correct and value is not None and value > 0 else None


def is_fast(result: EvalResult, p: float, baseline: str) -> bool:
    if not result.correct:
        return False
    if p == 0:
        return True
    value = speedup(result, baseline)
    return value is not None and value > p


def baseline_timed(results: Sequence[EvalResult], baseline: str) -> bool:
    """Whether fast_p (p > 0) means anything for these results: something ran on a GPU, and
    either nothing is correct (then fast_p is truly 0) or some correct result has a speedup."""
    if not any(r.device == "cuda" for r in results):
        return False
    correct = [r for r in results if r.correct]
    return not correct or any(speedup(r, baseline) is not None for r in correct)


def attempt_score(record: SampleRecord) -> tuple[float, ...]:
    """Order of attempts for 'best turn'; the earlier turn wins a tie."""
    result = record.result
    return (
        STAGE_RANK[result.status],
        speedup(result, "eager") or 0.0,
        speedup(result, "compile") or 0.0,
        -record.turn,
    )


# ---------------------------------------------------------------------------------- views
def by_sample(records: Iterable[SampleRecord]) -> dict[tuple[str, int], list[SampleRecord]]:
    groups: dict[tuple[str, int], list[SampleRecord]] = defaultdict(list)
    for record in records:
        groups[(record.task_id, record.sample)].append(record)
    for attempts in groups.values():
        attempts.sort(key=lambda r: r.turn)
    return dict(groups)


def last_view(records: Iterable[SampleRecord]) -> list[SampleRecord]:
    return [attempts[-1] for attempts in by_sample(records).values()]


def best_view(records: Iterable[SampleRecord], up_to_turn: int | None = None) -> list[SampleRecord]:
    view = []
    for attempts in by_sample(records).values():
        eligible = [r for r in attempts if up_to_turn is None or r.turn <= up_to_turn]
        if eligible:
            view.append(max(eligible, key=attempt_score))
    return view


# ---------------------------------------------------------------------------------- summaries
def selection_of(
    records: Iterable[SampleRecord], selection: Sequence[SelectedTask] | None = None
) -> list[SelectedTask]:
    """The selected tasks in their order, then any task that has records but is missing from
    ``selection`` by (level, id) (folders written before ``tasks.json``: every task)."""
    chosen = {t.task_id: t for t in selection or ()}
    samples: dict[str, set[int]] = defaultdict(set)
    first: dict[str, SampleRecord] = {}
    for record in records:
        samples[record.task_id].add(record.sample)
        first.setdefault(record.task_id, record)
    extra = [
        SelectedTask(
            task_id, record.level, record.category or "uncategorized", len(samples[task_id])
        )
        for task_id, record in first.items()
        if task_id not in chosen
    ]
    extra.sort(key=lambda t: (t.level or 0, t.task_id))
    return list(chosen.values()) + extra


def not_evaluated(
    view: Sequence[SampleRecord], selection: Sequence[SelectedTask]
) -> list[dict[str, Any]]:
    """The selected tasks without a scored attempt in ``view``, each with why."""
    scored = {r.task_id for r in view if r.result.scored}
    harness = Counter(r.task_id for r in view if not r.result.scored)
    rows = []
    for task in selection:
        if task.task_id in scored:
            continue
        if task.reason:
            reason = task.reason
        elif harness[task.task_id]:
            reason = f"harness errors only ({harness[task.task_id]} attempts)"
        else:
            reason = "no attempt recorded"
        rows.append(
            {
                "task_id": task.task_id,
                "level": task.level,
                "category": task.category,
                "samples": max(1, task.samples),
                "reason": reason,
            }
        )
    return rows


def summarize(
    view: Sequence[SampleRecord],
    config: StatsConfig | None = None,
    selection: Sequence[SelectedTask] | None = None,
) -> dict[str, Any]:
    """Every metric for one view (one attempt per task and sample) over the selected tasks
    (default: the tasks that have records in the view)."""
    config = config or StatsConfig()
    selection = selection_of(view, selection)
    missing = not_evaluated(view, selection)
    failed = sum(row["samples"] for row in missing)  # a not-evaluated task's failed attempts
    scored_view = [r for r in view if r.result.scored]
    results = [r.result for r in scored_view]
    conf = config.confidence

    def over_all(flags: list[bool]) -> Estimate:
        return rate(flags + [False] * failed, conf)

    summary: dict[str, Any] = {
        "tasks": len(selection),
        "evaluated_tasks": len(selection) - len(missing),
        "attempts": len(results) + failed,
        "harness_errors": len(view) - len(scored_view),
        "not_evaluated": missing,
        "parse_rate": over_all([parsed(r) for r in results]).to_dict(),
        "compile_rate": over_all([compiled(r) for r in results]).to_dict(),
        "correct_rate": over_all([r.correct for r in results]).to_dict(),
        "integrity_rate": over_all(
            [r.status is Status.INTEGRITY_VIOLATION for r in results]
        ).to_dict(),
        "status_counts": dict(sorted(Counter(str(r.result.status) for r in view).items())),
        "fast_p": {},
        "geomean_speedup": {},
        "pass_at_k": {},
    }
    for baseline in BASELINES:
        timed = baseline_timed(results, baseline)
        summary["fast_p"][baseline] = {
            _p_key(p): (
                over_all([is_fast(r, p, baseline) for r in results]).to_dict()
                if p == 0 or timed
                else Estimate(None, n=len(results) + failed).to_dict()
            )
            for p in FAST_P
        }
        speedups = [s for r in results if (s := speedup(r, baseline)) is not None]
        if speedups:
            low, high = bootstrap_interval(
                speedups, geomean, conf, config.bootstrap_samples, config.seed
            )
            estimate = Estimate(geomean(speedups), low, high, n=len(speedups))
        else:
            estimate = Estimate(None, n=0)
        summary["geomean_speedup"][baseline] = estimate.to_dict()
    per_task: dict[str, list[bool]] = {t.task_id: [] for t in selection}
    for record in scored_view:
        per_task[record.task_id].append(record.result.correct)
    drawn = max([1] + [t.samples for t in selection] + [len(f) for f in per_task.values()])
    for k in config.pass_ks:
        if k <= drawn:
            # missing samples (fewer than k scored, or none) count as failed
            values = [pass_at_k(max(len(f), k), sum(f), k) for f in per_task.values()]
            estimate, method = pass_at_k_estimate(values, config)
            summary["pass_at_k"][str(k)] = {**estimate.to_dict(), "interval": method}
        else:
            summary["pass_at_k"][str(k)] = Estimate(None, n=0).to_dict()
    return summary


def _p_key(p: float) -> str:
    return f"{p:g}"


def task_rows(
    view: Sequence[SampleRecord], selection: Sequence[SelectedTask] | None = None
) -> list[dict[str, Any]]:
    """One row per selected task: scored samples, correct ones, pass@1, best speedups, statuses,
    harness errors, and for a task without a scored attempt the reason (else empty)."""
    selection = selection_of(view, selection)
    reasons = {row["task_id"]: row["reason"] for row in not_evaluated(view, selection)}
    groups: dict[str, list[SampleRecord]] = defaultdict(list)
    for record in view:
        groups[record.task_id].append(record)
    rows = []
    for task in selection:
        records = groups.get(task.task_id, [])
        results = [r.result for r in records if r.result.scored]
        eager = [s for r in results if (s := speedup(r, "eager")) is not None]
        compile_ = [s for r in results if (s := speedup(r, "compile")) is not None]
        statuses = Counter(str(r.result.status) for r in records)
        correct = sum(r.correct for r in results)
        rows.append(
            {
                "task_id": task.task_id,
                "level": task.level,
                "category": task.category,
                "samples": len(results),
                "correct": correct,
                "pass_at_1": correct / len(results) if results else 0.0,
                "best_speedup_vs_eager": max(eager) if eager else None,
                "best_speedup_vs_compile": max(compile_) if compile_ else None,
                "statuses": dict(sorted(statuses.items())),
                "harness_errors": len(records) - len(results),
                "best_turn": min((r.turn for r in records if r.result.correct), default=None),
                "not_evaluated": reasons.get(task.task_id, ""),
            }
        )
    return rows


def turn_curve(
    records: Sequence[SampleRecord],
    config: StatsConfig | None = None,
    selection: Sequence[SelectedTask] | None = None,
) -> list[dict[str, Any]]:
    """Refinement progress: for each turn t, the metrics of the best attempt among turns <= t
    (over every selected task), and the correctness of the scored attempts made at turn t."""
    config = config or StatsConfig()
    if not records:
        return []
    selection = selection_of(records, selection)
    last_turn = max(r.turn for r in records)
    curve = []
    for turn in range(last_turn + 1):
        best = summarize(best_view(records, turn), config, selection)
        at_turn = [r.result.correct for r in records if r.turn == turn and r.result.scored]
        curve.append(
            {
                "turn": turn,
                "attempts": len(at_turn),
                "correct_at_turn": rate(at_turn, config.confidence).to_dict(),
                "best_so_far": {
                    key: best[key]
                    for key in (
                        "parse_rate",
                        "compile_rate",
                        "correct_rate",
                        "fast_p",
                        "geomean_speedup",
                    )
                },
            }
        )
    return curve


def sweep_summary(
    records: Sequence[SampleRecord],
    config: StatsConfig | None = None,
    selection: Sequence[SelectedTask] | None = None,
) -> dict[str, Any]:
    """The whole report's numbers: last and best turn, overall, per level, per category and per
    task, every one over the selected tasks (default: the tasks that have records)."""
    config = config or StatsConfig()
    selection = selection_of(records, selection)
    summary: dict[str, Any] = {"views": {}}
    views = {"last": last_view(records), "best": best_view(records)}
    levels = sorted({t.level for t in selection if t.level is not None})
    categories = sorted({t.category or "uncategorized" for t in selection})
    if categories == ["uncategorized"]:
        categories = []  # nothing known: no table of one row
    by_level = {str(v): [t for t in selection if t.level == v] for v in levels}
    by_category = {
        c: [t for t in selection if (t.category or "uncategorized") == c] for c in categories
    }
    for name, view in views.items():
        summary["views"][name] = {
            "overall": summarize(view, config, selection),
            "levels": {k: _part(view, config, part) for k, part in by_level.items()},
            "categories": {k: _part(view, config, part) for k, part in by_category.items()},
            "tasks": task_rows(view, selection),
        }
    summary["turns"] = turn_curve(records, config, selection)
    summary["max_turns"] = max((r.turn for r in records), default=-1) + 1
    summary["outcomes"] = outcomes(records)
    summary["generation"] = generation_stats(records)
    summary["selection"] = {
        "tasks": len(selection),
        "not_evaluated": not_evaluated(records, selection),
        "harness_errors": sum(not r.result.scored for r in records),
        "harness_error_tasks": sorted({r.task_id for r in records if not r.result.scored}),
    }
    return summary


def _part(
    view: Sequence[SampleRecord], config: StatsConfig, part: Sequence[SelectedTask]
) -> dict[str, Any]:
    ids = {t.task_id for t in part}
    return summarize([r for r in view if r.task_id in ids], config, part)


def outcomes(records: Sequence[SampleRecord]) -> dict[str, dict[str, int]]:
    """Status counts of every attempt, per turn ("1", "2", ...) and in total ("all")."""
    table: dict[str, dict[str, int]] = defaultdict(dict)
    for record in records:
        status = str(record.result.status)
        for column in (str(record.turn + 1), "all"):
            table[status][column] = table[status].get(column, 0) + 1
    return {status: table[status] for status in sorted(table)}


def generation_stats(records: Sequence[SampleRecord]) -> dict[str, Any]:
    """What the model produced: lengths, truncation (a frequent cause of format errors)."""
    tokens = [r.completion_tokens for r in records if r.completion_tokens is not None]
    prompts = [r.prompt_tokens for r in records if r.prompt_tokens is not None]
    seconds = [r.generation_s for r in records if r.generation_s is not None]
    reasons = Counter(r.finish_reason or "unknown" for r in records)
    return {
        "attempts": len(records),
        "finish_reasons": dict(sorted(reasons.items())),
        "truncated": reasons.get("length", 0),
        "mean_completion_tokens": mean(tokens) if tokens else None,
        "max_completion_tokens": max(tokens) if tokens else None,
        "mean_prompt_tokens": mean(prompts) if prompts else None,
        "max_prompt_tokens": max(prompts) if prompts else None,
        "mean_generation_s": mean(seconds) if seconds else None,
    }
