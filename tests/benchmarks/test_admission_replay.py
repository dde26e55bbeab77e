"""The admission replay: each rule admits as the real budget does, and a recorded harness run
is read repeat by repeat in the pool's order."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import admission_replay  # noqa: E402
from admission_replay import GIB, Evaluation  # noqa: E402

SCALE = 0.2  # a recorded second is 0.2 s here: long beside a busy box's scheduling delays


def two_large_then_a_small() -> list[Evaluation]:
    """Two 6 GiB plans that cannot run together in 10 GiB, then a 2 GiB one; a second each."""
    return [
        Evaluation("large_a", 0, 6 * GIB, 1.0),
        Evaluation("large_b", 0, 6 * GIB, 1.0),
        Evaluation("small", 0, 2 * GIB, 1.0),
    ]


@pytest.mark.parametrize(("rule", "small_waits"), [("in order", True), ("backfill", False),
                                                    ("first-fit", False)])  # fmt: skip
def test_a_small_plan_waits_behind_a_waiting_large_one_only_in_order(rule, small_waits):
    run = admission_replay.replay(two_large_then_a_small(), 3, 10 * GIB, rule, SCALE)
    assert run.waits_s[0] < 0.3  # the first large one starts at once
    assert 0.7 < run.waits_s[1] < 1.5  # the second waits for the first under every rule
    assert (run.waits_s[2] > 0.7) is small_waits
    assert 1.8 < run.first_repeat_s < 2.6  # the two large ones end to end bound the wall


def test_a_waiting_evaluation_holds_its_slot():
    """With a third slot the backfill ends the small one beside the first large one; with two,
    the second large one waits in a slot and the small one ends a second later."""
    three = admission_replay.replay(two_large_then_a_small(), 3, 10 * GIB, "backfill", SCALE)
    two = admission_replay.replay(two_large_then_a_small(), 2, 10 * GIB, "backfill", SCALE)
    assert three.ends_s[2] < 1.5 < 1.8 < two.ends_s[2]


def test_evaluations_are_read_repeat_by_repeat_in_the_pools_order():
    run = {"total": 3.0, "admission": 1.0}
    rows = {
        "a": {"kernelrl": [{"phase_seconds": run}, {"phase_seconds": run}]},
        "b": {"kernelrl": [{"phase_seconds": run}, {"status": "skipped (time budget)"}]},
    }
    found = admission_replay.evaluations(rows, ["b", "a"], {"a": 1, "b": 2})
    assert [(e.stem, e.repeat, e.need_bytes) for e in found] == [
        ("b", 0, 2), ("a", 0, 1), ("a", 1, 1)
    ]  # fmt: skip
    assert all(e.hold_s == 2.0 for e in found)  # the wait for memory is not held time


KB = os.environ.get("KERNELBENCH_DIR")
RECORDED = BENCHMARKS / "results" / "kernelbench_published_h100" / "admission_in_order"


@pytest.mark.skipif(not KB, reason="KERNELBENCH_DIR (KernelBench's task root) is not set")
def test_a_recorded_run_in_order_is_replayed_near_its_first_repeat(capsys):
    admission_replay.main([str(RECORDED / "b1" / "results.json"), "--kernelbench", KB,
                           "--capacity-gib", "67.26"])  # fmt: skip
    table = capsys.readouterr().out
    recorded = float(table.split("| recorded | ")[1].split(" |")[0])
    replayed = float(table.split("| replayed, in order | ")[1].split(" |")[0])
    assert abs(replayed / recorded - 1) < 0.1


def test_bad_input_is_one_line_naming_it(tmp_path, capsys):
    missing = tmp_path / "results.json"
    argv = [str(missing), "--kernelbench", str(tmp_path), "--capacity-gib", "67.26"]
    with pytest.raises(SystemExit):
        admission_replay.main(argv)
    assert "no such file" in capsys.readouterr().err
    missing.write_text('{"totals": {"kernelrl options": "move_local_memory=False"}, "rows": {}}')
    with pytest.raises(SystemExit):
        admission_replay.main(argv)  # the plans would be another run's
    assert "give its timing flags" in capsys.readouterr().err
    missing.write_text('{"totals": {}, "rows": {}}')
    with pytest.raises(SystemExit):
        admission_replay.main(argv)
    assert "no kernelrl evaluation is recorded" in capsys.readouterr().err
    run = {"kernelrl": [{"phase_seconds": {"total": 1.0}}]}
    missing.write_text(json.dumps({"totals": {}, "rows": {"19_ReLU": run}}))
    with pytest.raises(SystemExit):
        admission_replay.main(argv)  # tmp_path holds no task
    assert "is not the KernelBench task root" in capsys.readouterr().err
