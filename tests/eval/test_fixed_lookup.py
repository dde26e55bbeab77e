"""How fixed solutions are found and replayed: every one of KernelBench's 250 ids in every
folder layout (levels 1-3, with a checkout), and a replayed sweep that keeps how each completion
ended."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kernelrl.eval.clients import Request
from kernelrl.eval.config import EvalSweepConfig
from kernelrl.eval.fixed import FixedSolutions
from kernelrl.eval.report import write_report
from kernelrl.eval.sweep import Sweep
from kernelrl.launch.eval_cli import load_tasks


@pytest.mark.skipif(not os.environ.get("KERNELBENCH_DIR"), reason="KERNELBENCH_DIR is not set")
def test_kernelbench_levels_1_to_3_are_all_covered(tmp_path: Path) -> None:
    """Selection, solution lookup and categories cover all 250 problems: none is skipped.
    Nothing is evaluated (that needs a GPU): with no solutions every task is listed as failed."""
    config = EvalSweepConfig(
        output_dir=str(tmp_path / "run"),
        benchmark="kernelbench",
        benchmark_path=os.environ["KERNELBENCH_DIR"],
        levels=[1, 2, 3],
        client="fixed",
        fixed_solutions=[str(tmp_path / "no_solutions")],
        plots=False,
    )
    (tmp_path / "no_solutions").mkdir()
    tasks = load_tasks(config)
    ids = [t.id for t in tasks]
    assert len(ids) == 250 and len(set(ids)) == 250
    assert sum(i.endswith("_") for i in ids) > 0 and sum("__" in i for i in ids) > 0
    assert all(t.category != "uncategorized" for t in tasks), [
        t.id for t in tasks if t.category == "uncategorized"
    ]
    # every id is found in every layout: <id>/<label>.py, <id>.py and <id>__<label>.py
    for layout in ("{id}/sample.py", "{id}.py", "{id}__sample.py"):
        folder = tmp_path / layout.split("{")[0] / layout.replace("/", "_").replace(".", "_")
        for task_id in ids:
            path = folder / layout.format(id=task_id)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("x")
        fixed = FixedSolutions([folder], ids)
        assert [i for i in ids if fixed.samples_for(i) != 1] == [] and fixed.unmatched == [], layout
    # the sweep with no solutions: all 250 listed as failed, every denominator 250
    client = FixedSolutions(config.fixed_solutions, ids)
    outcome = Sweep(config, tasks, client, pool=None).run()
    assert outcome.records == []
    summary = write_report(outcome.folder, plots=False)
    overall = summary["views"]["last"]["overall"]
    assert overall["tasks"] == 250 and overall["correct_rate"]["n"] == 250
    assert overall["fast_p"]["eager"]["0"]["n"] == 250
    assert (overall["pass_at_k"]["1"]["value"], overall["pass_at_k"]["1"]["n"]) == (0.0, 250)
    assert [t["task_id"] for t in overall["not_evaluated"]] == ids
    assert {t["reason"] for t in overall["not_evaluated"]} == {"no solution"}
    levels = summary["views"]["last"]["levels"]
    assert {k: v["tasks"] for k, v in levels.items()} == {"1": 100, "2": 100, "3": 50}
    categories = summary["views"]["last"]["categories"]
    assert sum(v["tasks"] for v in categories.values()) == 250
    assert "uncategorized" not in categories


def test_a_replayed_sweep_keeps_how_each_completion_ended(tmp_path: Path) -> None:
    """Judged again, an answer cut at max_tokens is still a token-limit answer."""
    rows = [
        {"task_id": "a", "sample": 0, "turn": 1, "turn_base": 1, "completion": "x",
         "finish_reason": "length", "prompt_tokens": 10, "completion_tokens": 768},
        {"task_id": "a", "sample": 1, "turn": 1, "turn_base": 1, "completion": "y",
         "finish_reason": "stop", "completion_tokens": None},
    ]  # fmt: skip
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "folder" / "a").mkdir(parents=True)
    (tmp_path / "folder" / "a" / "one.py").write_text("z")
    fixed = FixedSolutions([tmp_path / "samples.jsonl", tmp_path / "folder"], ["a"])
    requests = [Request(task_id="a", sample=s, turn=0, messages=[], seed=0) for s in range(3)]
    cut, stopped, from_folder = fixed.generate(requests)
    assert (cut.text, cut.finish_reason, cut.prompt_tokens, cut.completion_tokens) == (
        "x",
        "length",
        10,
        768,
    )
    assert (stopped.finish_reason, stopped.completion_tokens) == ("stop", None)
    assert (from_folder.text, from_folder.finish_reason) == ("z", "fixed")
