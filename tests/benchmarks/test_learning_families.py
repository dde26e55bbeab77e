"""Where RL gained and lost, by core operator: held-out answers per stage and an RL run's train
rollouts by half and by group."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kernelrl.env.result import EvalResult, Status
from kernelrl.eval.records import SampleRecord

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import learning_families  # noqa: E402


def _tasks(path: Path, rows: list[tuple[str, str | None, str]]) -> None:
    path.mkdir(parents=True)
    graphs = [
        json.dumps({"core": {"kind": core}} if core else {"core": None}) for _, core, _ in rows
    ]
    table = pa.table({"id": [r[0] for r in rows], "graph": graphs, "family": [r[2] for r in rows]})
    pq.write_table(table, path / "data.parquet")


def _sweep(folder: Path, answers: list[tuple[str, Status, str]]) -> None:
    folder.mkdir(parents=True)
    lines = []
    for sample, (task_id, status, code) in enumerate(answers):
        result = EvalResult(task_id=task_id, backend="triton", status=status)
        record = SampleRecord(
            task_id=task_id, sample=sample, turn=0, result=result, completion=code
        )
        lines.append(json.dumps(record.to_dict()))
    (folder / "samples.jsonl").write_text("\n".join(lines) + "\n")


def _rollout(step: int, task_id: str, status: Status | None) -> str:
    result = None if status is None else EvalResult(task_id, "triton", status).to_dict()
    turn = {"completion": "", "result": result}
    return json.dumps({"task_id": task_id, "step": step, "turns": [turn]})


RIGHT, WRONG, OURS = Status.CORRECT, Status.INCORRECT, Status.HARNESS_ERROR


def test_answers_and_rollouts_are_counted_by_core_operator(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "learning"
    _tasks(
        out / "synth/tasks/heldout", [("h1", "log_softmax", "softmax"), ("h2", None, "elementwise")]
    )
    _tasks(
        out / "synth/tasks/train", [("t1", "log_softmax", "softmax"), ("t2", None, "elementwise")]
    )
    # Answers our harness failed on (harness_error, no result) are counted nowhere.
    _sweep(
        out / "eval_sft",
        [
            ("h1", RIGHT, "y = z - tl.log(s)"),
            ("h1", WRONG, ""),
            ("h2", WRONG, ""),
            ("h2", OURS, "tl.log("),
        ],
    )
    _sweep(out / "eval_rl", [("h1", WRONG, ""), ("h1", WRONG, ""), ("h2", RIGHT, "tl.log(")])
    run = tmp_path / "run"
    (run / "rollouts").mkdir(parents=True)
    # steps 0-1 (first half): t1 mixed then all wrong; steps 2-3: t2 all right, then mixed
    first = [(0, "t1", RIGHT), (0, "t1", WRONG), (1, "t1", WRONG), (1, "t1", OURS)]
    second = [(2, "t2", RIGHT), (3, "t2", RIGHT), (3, "t2", WRONG), (3, "t2", None)]
    (run / "rollouts/rank0.jsonl").write_text("\n".join(_rollout(*r) for r in first))
    (run / "rollouts/rank1.jsonl").write_text("\n".join(_rollout(*r) for r in second))
    learning_families.main([str(out), "--stages", "eval_sft", "eval_rl", "--rollouts", str(run)])
    rows = {line.split(" | ")[0].strip("| "): line for line in capsys.readouterr().out.splitlines()}
    assert rows["log_softmax"] == "| log_softmax | 2 | 1 -> 0 | 1 -> 0 | 1 of 3 / 0 of 0 | 1 of 2 |"
    assert rows["elementwise"] == "| elementwise | 1 | 0 -> 1 | 0 -> 1 | 0 of 0 / 2 of 3 | 1 of 2 |"


def test_a_folder_without_its_synthesis_is_refused_with_what_to_copy(tmp_path: Path) -> None:
    _sweep(tmp_path / "eval_sft", [("t0", Status.CORRECT, "x")])
    with pytest.raises(SystemExit, match="no synthetic tasks under"):
        learning_families.main([str(tmp_path), "--stages", "eval_sft"])


def test_a_task_one_stage_could_not_judge_is_left_out_of_every_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The harness failed on h2's answers after SFT: counting RL's answers to it would put
    answers in RL's column that SFT's has no counterpart of (the report pairs by task)."""
    out = tmp_path / "learning"
    _tasks(
        out / "synth/tasks/heldout", [("h1", "log_softmax", "softmax"), ("h2", None, "elementwise")]
    )
    _sweep(out / "eval_sft", [("h1", RIGHT, ""), ("h2", OURS, ""), ("h2", OURS, "")])
    _sweep(out / "eval_rl", [("h1", WRONG, ""), ("h2", RIGHT, ""), ("h2", RIGHT, "")])
    learning_families.main([str(out), "--stages", "eval_sft", "eval_rl"])
    printed = capsys.readouterr().out
    rows = {line.split(" | ")[0].strip("| "): line for line in printed.splitlines()}
    assert rows["log_softmax"].startswith("| log_softmax | 1 | 1 -> 0 |")
    assert "elementwise" not in rows
    assert "not judged at every stage): h2" in printed


def test_counts_summed_over_seeds_show_each_stage_s_answers() -> None:
    """The base model runs once and the other stages once per seed, so their answer counts
    differ once seeds are added up; the table must not print the first stage's for all."""
    counts = {
        "stages": ["base", "sft", "rl"],
        "operators": {
            "softmax": {
                "tasks": 3,
                "attempts": {"base": 4, "sft": 8, "rl": 8},
                "correct": {"base": 0, "sft": 5, "rl": 6},
            },
            "sum": {
                "tasks": 3,
                "attempts": {"base": 4, "sft": 8, "rl": 8},
                "correct": {"base": 1, "sft": 2, "rl": 3},
            },
        },
        "left_out": [],
    }
    table = learning_families.operator_markdown(counts, {})
    assert "| softmax | 3 | 4 -> 8 -> 8 | 0 -> 5 -> 6 |" in table
    assert "| all | 6 | 8 -> 16 -> 16 | 1 -> 7 -> 9 |" in table
    counts["operators"]["sum"]["attempts"] = {"base": 8, "sft": 8, "rl": 8}
    assert "| sum | 3 | 8 | 1 -> 2 -> 3 |" in learning_families.operator_markdown(counts, {})
