"""What the throughput benchmark prints of the compile companions (counts, and the reasons the
children gave for a kernel they compiled themselves, most frequent first) and of the trusted
process's own CPU time."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from kernelrl.env.evaluator import EvalConfig
from kernelrl.env.timing import TimingConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import env_throughput  # noqa: E402
import speedup_spreads  # noqa: E402


def test_the_companions_line_counts_kernels_and_names_the_reasons_for_misses() -> None:
    differs = "the companion's key differs: option debug (False here, True there)"
    records = [
        {"companion": "handed to the child", "compiled_ahead": 1, "found": 1, "errors": []},
        {
            "companion": "handed to the child",
            "compiled_ahead": 1,
            "compiled_here": 1,
            "errors": [differs],
        },
        {
            "companion": "handed to the child",
            "compiled_ahead": 1,
            "compiled_here": 1,
            "errors": [differs],
        },
        {"companion": "not ready within 5 s", "errors": []},
    ]
    line = env_throughput.companions(
        [SimpleNamespace(sandbox={"compile_ahead": r}) for r in records]
    )
    assert line.splitlines() == [
        "compile companions: 3 of 4 handed to their child; kernels found compiled by one 1, "
        "compiled in the child 2",
        f"  2 x {differs}",
    ]


def test_the_trusted_process_counts_its_own_cpu_time_and_not_its_childrens() -> None:
    before = env_throughput.trusted_cpu_seconds()
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass",
        ],
        check=True,
    )
    after_child = env_throughput.trusted_cpu_seconds()
    spin = time.process_time()
    while time.process_time() - spin < 0.3:
        pass
    after_own = env_throughput.trusted_cpu_seconds()
    assert after_child - before < 0.2  # the child's 0.5 s are not the trusted process's
    assert after_own - after_child >= 0.3


def test_the_steady_rate_leaves_out_a_pass_s_start_and_its_tail() -> None:
    """One completion a second for 20 s, then a tail of 30 s for the last two: the steady rate
    is the pool's 60/min, whatever the tail did to the whole pass's."""
    finished = [float(i) for i in range(20)] + [50.0, 52.0]
    results = [SimpleNamespace(timestamp=t - 1.0, phase_seconds={"total": 1.0}) for t in finished]
    assert env_throughput.steady_per_min(results) == 60.0
    assert env_throughput.steady_per_min(results[:9]) is None


def test_a_task_s_speed_up_spread_is_its_max_over_min_beside_its_two_sides() -> None:
    def result(task_id: str, runtime: float, reference: float, *placed: float) -> SimpleNamespace:
        return SimpleNamespace(
            task_id=task_id,
            speedup_vs_eager=reference / runtime,
            runtime=SimpleNamespace(
                median_ms=runtime, placement_medians_ms=list(placed), rel_err=0.002
            ),
            ref_eager=SimpleNamespace(median_ms=reference),
            sandbox={},
        )

    results = [
        result("a", 1.0, 2.0, 0.99, 1.01),
        result("a", 1.05, 2.0, 1.0, 1.1),
        result("a", 1.02, 2.0, 1.0, 1.04),
        result("b", 1.0, 1.0),
    ]
    spreads = speedup_spreads.report_spreads(results)
    assert spreads["speedup_medians"] == {"a": 2.0 / 1.02, "b": 1.0}
    assert spreads["spreads"] == {"a": 1.05}
    assert spreads["runtime_spreads"] == {"a": 1.05, "b": None}
    assert spreads["reference_spreads"] == {"a": 1.0, "b": None}
    # Within an evaluation: the median of 1.02, 1.1 and 1.04; none from one placement.
    assert spreads["placement_spreads"] == {"a": 1.04, "b": None}
    # What a run was timed on, beside what it asked for: two sets each, and one none.
    assert spreads["input_sets_timed"] == {2: 3, 0: 1}
    # Said 0.2% each; seen: stdev(1.0, 1.05, 1.02) / mean = 2.5%.
    assert spreads["runtime_errors"]["a"] == {"said": 0.002, "seen": 0.0246}
    assert spreads["runtime_errors"]["b"] == {"said": 0.002, "seen": None}


def test_the_clocks_each_timing_ended_at_are_summed_up_over_a_pass() -> None:
    def result(sm_mhz: int, temperature_c: int, *held_down: str) -> SimpleNamespace:
        clocks = {"sm_mhz": sm_mhz, "memory_mhz": 2619, "temperature_c": temperature_c}
        return SimpleNamespace(sandbox={"gpu_clocks": {**clocks, "held_down": list(held_down)}})

    results = [
        result(1980, 55),
        result(1755, 71, "sw_power_cap"),
        result(1830, 64, "sw_power_cap", "sw_thermal"),
        SimpleNamespace(sandbox={}),  # a CPU evaluation, or NVML not readable
    ]
    assert speedup_spreads.report_clocks(results) == {
        "sm_mhz": [1755, 1830, 1980],
        "temperature_c": [55, 71],
        "held_down": {"sw_power_cap": 2, "sw_thermal": 1},
    }
    assert speedup_spreads.report_clocks([SimpleNamespace(sandbox={})]) == {}


def test_more_first_input_sets_than_a_timing_may_take_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["env_throughput.py", "--placements", "20"])
    with pytest.raises(SystemExit):
        env_throughput.parse_args()
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error == (
        "env_throughput.py: error: placements (20) must be at least 1 and at most"
        " most_placements (16)"
    )
    monkeypatch.setattr(sys, "argv", ["env_throughput.py", "--most-placements", "4"])
    assert env_throughput.parse_args().most_placements == 4


def test_the_evaluator_flags_default_to_the_environment_s_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run without flags times as the environment does (the local memory moved, memory
    admitted in the order evaluations asked for it); each flag names the setting it turns."""
    monkeypatch.setattr(sys, "argv", ["env_throughput.py"])
    args = env_throughput.parse_args()
    assert args.move_local_memory is TimingConfig.move_local_memory is True
    assert args.admission_in_order is EvalConfig.admission_in_order is True
    argv = ["env_throughput.py", "--no-move-local-memory", "--no-admission-in-order"]
    monkeypatch.setattr(sys, "argv", argv)
    args = env_throughput.parse_args()
    assert (args.move_local_memory, args.admission_in_order) == (False, False)


def test_a_task_over_the_spread_limit_lists_its_evaluations_as_they_started() -> None:
    """Of a task whose speed-up spread is over 1.03, every evaluation in the order it started,
    so that the one lying off can be told apart (here the first of the pass); a task within
    the limit lists none."""

    def result(task: str, started: float, runtime: float, *placed: float) -> SimpleNamespace:
        return SimpleNamespace(
            task_id=task,
            timestamp=started,
            speedup_vs_eager=2.0 / runtime,
            runtime=SimpleNamespace(median_ms=runtime, placement_medians_ms=list(placed)),
            ref_eager=SimpleNamespace(median_ms=2.0),
            sandbox={"gpu_clocks": {"sm_mhz": 1980}},
        )

    results = [
        result("conv", 100.5, 1.0, 1.0, 1.01),
        result("conv", 100.0, 1.05, 1.04, 1.06),  # started first, lies 5% off
        result("relu", 100.2, 1.0, 1.0),
        result("relu", 101.0, 1.01, 1.01),
        result("conv", 102.0, 1.0, 0.99, 1.0),
    ]
    found = speedup_spreads.report_spread_evaluations(results)
    assert list(found) == ["conv"]
    assert [e["started"] for e in found["conv"]] == [0, 2, 4]
    assert [e["started_s"] for e in found["conv"]] == [0.0, 0.5, 2.0]
    assert [e["of_median"] for e in found["conv"]] == [1.05, 1.0, 1.0]
    assert found["conv"][0]["sets_spread"] == 1.019 and found["conv"][0]["sets"] == 2
    assert found["conv"][0]["sm_mhz"] == 1980
    assert speedup_spreads.report_spread_evaluations(results, limit=1.06) == {}


def test_the_report_says_how_many_evaluations_waited_for_gpu_memory_and_how_long() -> None:
    said = env_throughput.admission_waits([0.0, 0.004, 2.5, 30.25])
    assert said == "waited for GPU memory: 2 of 4 evaluations, 32.8 s in all (longest 30.2 s)"
    assert env_throughput.admission_waits([]).startswith("waited for GPU memory: 0 of 0")
