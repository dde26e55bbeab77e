"""Every sweep metric on hand-built EvalResults whose answers were worked out by hand.

No kernel runs here: the records are built directly, so each expected number below follows
from the definitions in kernelrl/eval/metrics.py by arithmetic written out in the comments.
"""

from __future__ import annotations

import json
import math

import pytest

from kernelrl.env.result import EvalResult, Status
from kernelrl.eval.estimators import (
    StatsConfig,
    bootstrap_interval,
    geomean,
    pass_at_k,
    wilson_interval,
)
from kernelrl.eval.metrics import (
    best_view,
    last_view,
    summarize,
    sweep_summary,
    task_rows,
    turn_curve,
)
from kernelrl.eval.records import (
    SampleRecord,
    SamplesFile,
    SelectedTask,
    read_records,
    write_tasks,
)
from kernelrl.eval.report import write_report

Z = 1.959963984540054  # standard normal quantile at 0.975 (95% two-sided)


def record(
    task: str,
    sample: int,
    status: Status,
    eager: float | None = None,
    compile_: float | None = None,
    turn: int = 0,
    level: int | None = None,
    device: str = "cuda",
    ran: int = 0,
) -> SampleRecord:
    result = EvalResult(
        task_id=task,
        backend="triton",
        status=status,
        device=device,
        speedup_vs_eager=eager,
        speedup_vs_compile=compile_,
        input_sets_checked=ran,
        timing_meaningful=device == "cuda" and status is Status.CORRECT,
    )
    return SampleRecord(
        task, sample, turn, result, completion=f"{task}/{sample}/{turn}", level=level
    )


# Sweep A: 4 tasks x 2 samples, one turn, timed on a GPU.
#   task       level  sample 0                                    sample 1
#   l1/1_a     1      correct, 2.5x eager, 1.1x compile           correct, 0.8x eager, 0.5x compile
#   l1/2_b     1      incorrect (ran 1 input set)                 compile_error
#   l2/1_c     2      format_error                                integrity_violation, static (never ran)
#   l2/2_d     2      integrity_violation, dynamic (ran 3 sets)   correct, 1.25x eager, 1.0x compile
SWEEP_A = [
    record("l1/1_a", 0, Status.CORRECT, 2.5, 1.1, level=1, ran=3),
    record("l1/1_a", 1, Status.CORRECT, 0.8, 0.5, level=1, ran=3),
    record("l1/2_b", 0, Status.INCORRECT, level=1, ran=1),
    record("l1/2_b", 1, Status.COMPILE_ERROR, level=1),
    record("l2/1_c", 0, Status.FORMAT_ERROR, level=2),
    record("l2/1_c", 1, Status.INTEGRITY_VIOLATION, level=2, ran=0),
    record("l2/2_d", 0, Status.INTEGRITY_VIOLATION, level=2, ran=3),
    record("l2/2_d", 1, Status.CORRECT, 1.25, 1.0, level=2, ran=3),
]


def wilson(successes: int, n: int) -> tuple[float, float]:
    p = successes / n
    d = 1 + Z * Z / n
    center = (p + Z * Z / (2 * n)) / d
    half = Z * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n)) / d
    return center - half, center + half


def test_pass_at_k_by_hand() -> None:
    # 1 - C(n-c, k) / C(n, k)
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # 1 - 7/10
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)  # 1 - C(3,3)/C(5,3) = 1 - 1/10
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(2, 1, 2) == 1.0  # n - c < k: every draw of 2 contains the correct one
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_wilson_interval_by_hand() -> None:
    # 3 of 8 at 95%: z^2 = 3.841459; denominator 1 + z^2/8 = 1.480182;
    # center (0.375 + z^2/16) / 1.480182 = 0.615091 / 1.480182 = 0.415551;
    # half z * sqrt(0.375 * 0.625 / 8 + z^2 / 256) / 1.480182 = 1.959964 * 0.210482 / 1.480182
    #      = 0.278707  ->  [0.136844, 0.694258]
    low, high = wilson_interval(3, 8)
    assert low == pytest.approx(0.136844, abs=1e-5)
    assert high == pytest.approx(0.694258, abs=1e-5)
    # 0 of 8: the lower bound is 0, the upper z^2/8 / (1 + z^2/8) = 0.480182/1.480182 = 0.324408
    assert wilson_interval(0, 8) == (0.0, pytest.approx(0.324408, abs=1e-5))
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_every_metric_of_sweep_a() -> None:
    s = summarize(SWEEP_A, StatsConfig(pass_ks=(1, 2)))
    assert s["tasks"] == 4 and s["attempts"] == 8
    # parse: everything but the format error -> 7/8
    assert (s["parse_rate"]["count"], s["parse_rate"]["n"]) == (7, 8)
    assert s["parse_rate"]["value"] == pytest.approx(0.875)
    # compiled: 1_a s0, 1_a s1, 2_b s0 (incorrect ran), 2_d s0 (dynamic violation ran), 2_d s1
    #           -> 5/8; not: compile_error, format_error, static violation
    assert s["compile_rate"]["count"] == 5
    # correct: 1_a s0, 1_a s1, 2_d s1 -> 3/8, Wilson [0.136844, 0.694258] (see above)
    correct = s["correct_rate"]
    assert (correct["count"], correct["value"]) == (3, pytest.approx(0.375))
    assert correct["low"] == pytest.approx(0.136844, abs=1e-5)
    assert correct["high"] == pytest.approx(0.694258, abs=1e-5)
    # integrity violations: 1_c s1 and 2_d s0 -> 2/8
    assert s["integrity_rate"]["count"] == 2
    # fast_p vs eager over 8 attempts; correct speedups 2.5, 0.8, 1.25:
    #   p=0: all 3 correct; p=1: 2.5, 1.25; p=1.2: 2.5, 1.25 (1.25 > 1.2); p=2: 2.5
    eager = s["fast_p"]["eager"]
    assert [eager[p]["count"] for p in ("0", "1", "1.2", "2")] == [3, 2, 2, 1]
    assert eager["2"]["value"] == pytest.approx(1 / 8)
    # fast_p vs compile; correct speedups 1.1, 0.5, 1.0:
    #   p=0: 3; p=1: 1.1 only (1.0 is not > 1); p=1.2: none; p=2: none
    compiled = s["fast_p"]["compile"]
    assert [compiled[p]["count"] for p in ("0", "1", "1.2", "2")] == [3, 1, 0, 0]
    # geometric means over correct attempts:
    #   eager (2.5 * 0.8 * 1.25)^(1/3) = 2.5^(1/3) = 1.357209
    #   compile (1.1 * 0.5 * 1.0)^(1/3) = 0.55^(1/3) = 0.819321
    assert s["geomean_speedup"]["eager"]["value"] == pytest.approx(1.357209, abs=1e-6)
    assert s["geomean_speedup"]["eager"]["n"] == 3
    assert s["geomean_speedup"]["compile"]["value"] == pytest.approx(0.819321, abs=1e-6)
    # pass@1 per task c/n: 1_a 2/2, 2_b 0/2, 1_c 0/2, 2_d 1/2 -> (1 + 0 + 0 + 0.5)/4 = 0.375
    # pass@2 per task: 1_a 1, 2_b 0, 1_c 0, 2_d 1 - C(1,2)/C(2,2) = 1 -> 2/4 = 0.5
    assert s["pass_at_k"]["1"]["value"] == pytest.approx(0.375)
    assert s["pass_at_k"]["2"]["value"] == pytest.approx(0.5)
    assert s["pass_at_k"]["1"]["n"] == 4
    # bootstrap intervals hold the estimate
    for estimate in (s["pass_at_k"]["1"], s["geomean_speedup"]["eager"]):
        assert estimate["low"] <= estimate["value"] <= estimate["high"]
    assert s["status_counts"] == {
        "compile_error": 1,
        "correct": 3,
        "format_error": 1,
        "incorrect": 1,
        "integrity_violation": 2,
    }


def test_per_level_and_per_task() -> None:
    summary = sweep_summary(SWEEP_A, StatsConfig(pass_ks=(1,)))
    levels = summary["views"]["last"]["levels"]
    # level 1: 1_a s0, s1 correct; 2_b none -> 2/4; level 2: 2_d s1 -> 1/4
    assert levels["1"]["correct_rate"]["count"] == 2 and levels["1"]["attempts"] == 4
    assert levels["2"]["correct_rate"]["count"] == 1
    # level 2's only correct attempt is 1.25x eager: fast_1 = 1/4, geomean 1.25
    assert levels["2"]["fast_p"]["eager"]["1"]["value"] == pytest.approx(0.25)
    assert levels["2"]["geomean_speedup"]["eager"]["value"] == pytest.approx(1.25)
    rows = {row["task_id"]: row for row in task_rows(SWEEP_A)}
    assert rows["l1/1_a"]["correct"] == 2 and rows["l1/1_a"]["best_speedup_vs_eager"] == 2.5
    assert rows["l2/2_d"]["pass_at_1"] == 0.5
    assert rows["l2/2_d"]["best_speedup_vs_compile"] == 1.0
    assert rows["l1/2_b"]["best_speedup_vs_eager"] is None


def test_cpu_results_have_no_fast_p_above_zero() -> None:
    # The same verdicts on CPU: no timings, so fast_p (p > 0) and speedups are unknown, not 0.
    cpu = [
        record(r.task_id, r.sample, r.result.status, device="cpu", ran=r.result.input_sets_checked)
        for r in SWEEP_A
    ]
    s = summarize(cpu)
    assert s["fast_p"]["eager"]["0"]["count"] == 3
    assert s["fast_p"]["eager"]["1"]["value"] is None
    assert s["fast_p"]["compile"]["2"]["value"] is None
    assert s["geomean_speedup"]["eager"]["value"] is None


def test_gpu_sweep_with_nothing_correct_has_fast_p_zero() -> None:
    s = summarize([record("t", 0, Status.INCORRECT, ran=1), record("t", 1, Status.FORMAT_ERROR)])
    assert s["fast_p"]["eager"]["1"]["value"] == 0.0
    assert s["pass_at_k"]["1"]["value"] == 0.0


# Sweep B: one task, 2 samples, 3 turns (refinement), on a GPU.
#   sample 0: format_error -> incorrect -> compile_error
#   sample 1: correct 1.5x -> correct 3.0x -> incorrect
SWEEP_B = [
    record("t", 0, Status.FORMAT_ERROR, turn=0),
    record("t", 0, Status.INCORRECT, turn=1, ran=1),
    record("t", 0, Status.COMPILE_ERROR, turn=2),
    record("t", 1, Status.CORRECT, 1.5, 1.2, turn=0, ran=3),
    record("t", 1, Status.CORRECT, 3.0, 2.5, turn=1, ran=3),
    record("t", 1, Status.INCORRECT, turn=2, ran=1),
]


def test_last_and_best_turn() -> None:
    last = {r.sample: r for r in last_view(SWEEP_B)}
    assert (last[0].turn, last[1].turn) == (2, 2)
    best = {r.sample: r for r in best_view(SWEEP_B)}
    # sample 0: the furthest stage is 'incorrect' (turn 1); sample 1: the fastest correct (turn 1)
    assert (best[0].turn, best[1].turn) == (1, 1)
    summary = sweep_summary(SWEEP_B, StatsConfig(pass_ks=(1, 2)))
    last_s, best_s = summary["views"]["last"]["overall"], summary["views"]["best"]["overall"]
    # last turn: compile_error, incorrect -> parse 2/2, compiled 1/2, correct 0/2, pass@2 0
    assert last_s["parse_rate"]["count"] == 2
    assert last_s["compile_rate"]["count"] == 1
    assert last_s["correct_rate"]["count"] == 0
    assert last_s["pass_at_k"]["2"]["value"] == 0.0
    # best turn: incorrect, correct 3.0x -> correct 1/2, fast_2 eager 1/2, fast_2 compile
    # (2.5 > 2) 1/2, geomean eager 3.0, pass@1 = 1/2, pass@2 = 1
    assert best_s["correct_rate"]["count"] == 1
    assert best_s["fast_p"]["eager"]["2"]["count"] == 1
    assert best_s["fast_p"]["compile"]["2"]["count"] == 1
    assert best_s["geomean_speedup"]["eager"]["value"] == pytest.approx(3.0)
    assert best_s["pass_at_k"]["1"]["value"] == pytest.approx(0.5)
    assert best_s["pass_at_k"]["2"]["value"] == pytest.approx(1.0)
    assert summary["max_turns"] == 3
    # every attempt, per turn: turn 1 format 1 correct 1; turn 2 incorrect 1 correct 1;
    # turn 3 compile_error 1 incorrect 1
    assert summary["outcomes"] == {
        "compile_error": {"3": 1, "all": 1},
        "correct": {"1": 1, "2": 1, "all": 2},
        "format_error": {"1": 1, "all": 1},
        "incorrect": {"2": 1, "3": 1, "all": 2},
    }
    # first correct turn of the task in the best view: turn index 1
    assert summary["views"]["best"]["tasks"][0]["best_turn"] == 1


def test_turn_curve() -> None:
    curve = turn_curve(SWEEP_B)
    # turn 0: best so far = (format_error, correct 1.5x): parse 1/2, correct 1/2, fast_1 1/2,
    #         fast_2 0/2, geomean 1.5; at turn 0: correct 1/2
    # turn 1: best so far = (incorrect, correct 3.0x): parse 2/2, correct 1/2, fast_2 1/2,
    #         geomean 3.0; at turn 1: correct 1/2
    # turn 2: best so far unchanged; at turn 2: correct 0/2
    assert [p["correct_at_turn"]["count"] for p in curve] == [1, 1, 0]
    assert [p["best_so_far"]["parse_rate"]["count"] for p in curve] == [1, 2, 2]
    assert [p["best_so_far"]["correct_rate"]["count"] for p in curve] == [1, 1, 1]
    assert [p["best_so_far"]["fast_p"]["eager"]["2"]["count"] for p in curve] == [0, 1, 1]
    geomeans = [p["best_so_far"]["geomean_speedup"]["eager"]["value"] for p in curve]
    assert geomeans == [pytest.approx(1.5), pytest.approx(3.0), pytest.approx(3.0)]


def test_best_turn_tie_goes_to_the_earlier_turn() -> None:
    # Two correct attempts without timings (CPU): equal scores, the earlier one is the best.
    records = [
        record("t", 0, Status.CORRECT, turn=0, device="cpu"),
        record("t", 0, Status.CORRECT, turn=1, device="cpu"),
    ]
    assert best_view(records)[0].turn == 0
    # An integrity violation ranks below an honest format error.
    records = [
        record("t", 0, Status.FORMAT_ERROR, turn=0),
        record("t", 0, Status.INTEGRITY_VIOLATION, turn=1),
    ]
    assert best_view(records)[0].result.status is Status.FORMAT_ERROR


def test_bootstrap_is_deterministic_and_degenerate_for_constants() -> None:
    assert bootstrap_interval([2.0, 2.0, 2.0], geomean) == (pytest.approx(2.0), pytest.approx(2.0))
    values = [0.5, 1.0, 2.0, 4.0, 8.0]
    first = bootstrap_interval(values, geomean, seed=3, resamples=500)
    assert first == bootstrap_interval(values, geomean, seed=3, resamples=500)
    assert min(values) <= first[0] <= geomean(values) <= first[1] <= max(values)


def test_records_round_trip_and_torn_line(tmp_path) -> None:
    path = tmp_path / "samples.jsonl"
    store = SamplesFile(path)
    for r in SWEEP_B[:2]:
        store.append(r)
    with path.open("a") as handle:  # a run killed in the middle of a write
        handle.write('{"task_id": "t", "sample": 1, "tu')
    assert [r.key for r in read_records(path)] == [("t", 0, 0), ("t", 0, 1)]
    store = SamplesFile(path)  # reopening cuts the torn tail
    store.append(SWEEP_B[3])
    loaded = store.load()
    assert sorted(loaded) == [("t", 0, 0), ("t", 0, 1), ("t", 1, 0)]
    again = loaded[("t", 1, 0)]
    assert again.result.status is Status.CORRECT and again.result.speedup_vs_eager == 1.5
    assert again.completion == "t/1/0"


# ------------------------------------------------------------- denominators over every selected task
def test_a_task_that_was_not_evaluated_counts_as_failed_and_is_listed() -> None:
    # One good task and one the sweep could not evaluate: pass@1 is 1/2, not 1/1 (KernelBench's
    # fast_p is over all tasks). The unevaluated task adds its one planned sample as a failure.
    good = [record("l1/1_a", 0, Status.CORRECT, 2.0, 1.5, level=1, ran=3)]
    selection = [
        SelectedTask("l1/1_a", 1, "elementwise", 1),
        SelectedTask("l1/2_b", 1, "matmul", 1, reason="not evaluated: RuntimeError: pool died"),
    ]
    s = summarize(good, StatsConfig(pass_ks=(1,)), selection)
    assert (s["tasks"], s["evaluated_tasks"], s["attempts"]) == (2, 1, 2)
    assert s["pass_at_k"]["1"]["value"] == pytest.approx(0.5) and s["pass_at_k"]["1"]["n"] == 2
    for key in ("parse_rate", "compile_rate", "correct_rate"):
        assert (s[key]["count"], s[key]["n"]) == (1, 2), key
    assert (s["fast_p"]["eager"]["1"]["count"], s["fast_p"]["eager"]["1"]["n"]) == (1, 2)
    assert s["fast_p"]["eager"]["2"]["count"] == 0  # 2.0 is not > 2
    assert s["geomean_speedup"]["eager"]["value"] == pytest.approx(2.0)  # correct attempts only
    assert [(row["task_id"], row["reason"]) for row in s["not_evaluated"]] == [
        ("l1/2_b", "not evaluated: RuntimeError: pool died")
    ]
    # without a selection the same records give 1/1: the selection is what makes the difference
    assert summarize(good)["correct_rate"]["value"] == 1.0
    # a task planned with 3 samples and none evaluated counts 3 failed attempts
    selection[1] = SelectedTask("l1/2_b", 1, "matmul", 3, reason="no solution")
    s = summarize(good, StatsConfig(pass_ks=(1,)), selection)
    assert (s["correct_rate"]["count"], s["correct_rate"]["n"]) == (1, 4)
    assert s["pass_at_k"]["1"]["value"] == pytest.approx(0.5)


def test_harness_errors_are_counted_apart() -> None:
    # a: correct. b: sample 0 a harness error, sample 1 incorrect. c: harness errors only.
    records = [
        record("a", 0, Status.CORRECT, 1.5, ran=3),
        record("b", 0, Status.HARNESS_ERROR),
        record("b", 1, Status.INCORRECT, ran=1),
        record("c", 0, Status.HARNESS_ERROR),
    ]
    s = summarize(records, StatsConfig(pass_ks=(1, 2)))
    assert s["harness_errors"] == 2
    # rates: a's attempt, b's scored attempt, c's one sample failed (not evaluated) -> 1/3
    assert (s["correct_rate"]["count"], s["correct_rate"]["n"]) == (1, 3)
    assert (s["compile_rate"]["count"], s["parse_rate"]["count"]) == (2, 2)
    assert s["status_counts"] == {"correct": 1, "harness_error": 2, "incorrect": 1}
    # pass@1 per task: a 1/1, b 0/1 (its harness error is not a sample), c 0 -> 1/3
    assert s["pass_at_k"]["1"]["value"] == pytest.approx(1 / 3)
    # pass@2: b was planned 2 samples, its lost one counts as failed: a 1 (n=2 after the
    # missing sample, c=1), b 0, c 0 -> 1/3; pass@3: no task was planned 3 samples -> n/a
    s = summarize(records, StatsConfig(pass_ks=(2, 3)))
    assert s["pass_at_k"]["2"]["value"] == pytest.approx(1 / 3)
    assert s["pass_at_k"]["3"]["value"] is None
    assert [(r["task_id"], r["reason"]) for r in s["not_evaluated"]] == [
        ("c", "harness errors only (1 attempts)")
    ]
    rows = {row["task_id"]: row for row in task_rows(records)}
    assert (rows["b"]["samples"], rows["b"]["harness_errors"], rows["b"]["not_evaluated"]) == (
        1,
        1,
        "",
    )
    assert rows["c"]["not_evaluated"].startswith("harness errors only")
    summary = sweep_summary(records, StatsConfig(pass_ks=(1,)))
    assert summary["selection"]["harness_errors"] == 2
    assert summary["selection"]["harness_error_tasks"] == ["b", "c"]
    assert summary["outcomes"]["harness_error"] == {"1": 2, "all": 2}
    # the best turn of a sample is never a harness error when a scored turn exists
    turns = [
        record("t", 0, Status.FORMAT_ERROR, turn=0),
        record("t", 0, Status.HARNESS_ERROR, turn=1),
    ]
    assert best_view(turns)[0].result.status is Status.FORMAT_ERROR


def test_groups_and_report_cover_every_selected_task(tmp_path) -> None:
    records = [
        record("level1/1_a_", 0, Status.CORRECT, 1.5, level=1, ran=3),
        record("level2/1_b__c", 0, Status.HARNESS_ERROR, level=2),
    ]
    selection = [
        SelectedTask("level1/1_a_", 1, "elementwise", 1),
        SelectedTask("level1/2_m", 1, "matmul", 0, reason="no solution"),
        SelectedTask("level2/1_b__c", 2, "fused", 1),
    ]
    summary = sweep_summary(records, StatsConfig(pass_ks=(1,)), selection)
    last = summary["views"]["last"]
    assert last["overall"]["tasks"] == 3 and last["overall"]["correct_rate"]["n"] == 3
    assert {k: (v["tasks"], v["correct_rate"]["n"]) for k, v in last["levels"].items()} == {
        "1": (2, 2),
        "2": (1, 1),
    }
    assert sorted(last["categories"]) == ["elementwise", "fused", "matmul"]
    assert last["categories"]["matmul"]["correct_rate"]["value"] == 0.0
    assert [t["task_id"] for t in last["tasks"]] == [t.task_id for t in selection]
    # the report folder: samples.jsonl + tasks.json, rebuilt from the folder alone
    store = SamplesFile(tmp_path / "samples.jsonl")
    for r in records:
        store.append(r)
    write_tasks(tmp_path / "tasks.json", selection)
    (tmp_path / "config.json").write_text('{"samples": 1}')
    written = write_report(tmp_path, plots=False)
    assert written["views"]["last"]["overall"]["correct_rate"]["n"] == 3
    report = (tmp_path / "report.md").read_text()
    assert "| correct | 33.3%" in report and "(1/3) |" in report
    assert "## Not evaluated (counted as failed)" in report
    assert "| level1/2_m | 1 | no solution |" in report
    assert "| level2/1_b__c | 2 | harness errors only (1 attempts) |" in report
    assert "**harness errors: 1** (not the solution's fault; rerun)" in report
    assert "| harness errors | 1 (not the solution's fault; rerun) |" in report
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert [t["task_id"] for t in saved["selection"]["not_evaluated"]] == [
        "level1/2_m",
        "level2/1_b__c",
    ]
