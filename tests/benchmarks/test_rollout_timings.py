"""benchmarks/rollout_timings.py: an RL run's environment timings from its saved rollouts, the
rollouts written as the trainer writes them (``EvalResult.to_dict`` under each turn)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kernelrl.env.result import EvalResult, Status

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import rollout_timings  # noqa: E402


def _run(folder: Path, results: list[EvalResult | None]) -> Path:
    (folder / "rollouts").mkdir(parents=True)
    rows = [
        {"id": f"t/{i}", "turns": [{"result": r and r.to_dict()}]} for i, r in enumerate(results)
    ]
    (folder / "rollouts" / "rank0.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return folder


def _result(status: Status, total: float, cuda_init: float) -> EvalResult:
    return EvalResult(
        task_id="t",
        backend="triton",
        status=status,
        phase_seconds={"total": total},
        sandbox={"cuda_init_seconds": cuda_init, "isolation": "namespaces"},
        solution_hash=f"{status}-{total}",
        timestamp=total,
    )


def test_a_turn_answered_by_the_store_is_not_counted_as_an_evaluation(tmp_path: Path) -> None:
    evaluated = _result(Status.CORRECT, 2.0, 3.0)
    run = _run(tmp_path / "a", [evaluated, evaluated, _result(Status.CORRECT, 4.0, 3.0)])
    assert len(rollout_timings.evaluation_results(run)) == 2


def test_each_timing_is_summarised_per_run_and_unjudged_turns_are_left_out(tmp_path: Path) -> None:
    run = _run(
        tmp_path / "a",
        [
            _result(Status.CORRECT, 2.0, 3.0),
            _result(Status.INCORRECT, 4.0, 5.0),
            _result(Status.INCORRECT, 9.0, 10.0),
            None,  # a turn the environment never judged (format error before evaluation)
        ],
    )
    summary = rollout_timings.timing_summary(rollout_timings.evaluation_results(run))
    assert summary["phase total"] == {"mean": 5.0, "median": 4.0, "p90": 9.0, "count": 3}
    assert summary["child cuda_init"]["mean"] == 6.0
    assert not any("isolation" in name for name in summary)


def test_runs_sit_side_by_side_with_their_statuses(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", [_result(Status.CORRECT, 2.0, 3.0)])
    b = _run(tmp_path / "b", [_result(Status.INCORRECT, 6.0, 11.0)])
    table = rollout_timings.markdown(
        {"a": rollout_timings.evaluation_results(a), "b": rollout_timings.evaluation_results(b)}
    )
    assert "| child cuda_init | 3.00 / 3.00 / 3.00 (1) | 11.00 / 11.00 / 11.00 (1) |" in table
    assert "| statuses | correct 1 | incorrect 1 |" in table


def test_a_run_saved_without_rollouts_is_refused_with_why(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="save_rollouts"):
        rollout_timings.evaluation_results(tmp_path)
