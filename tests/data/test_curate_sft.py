"""SFT selection (correct, honest, fast, concise, capped) and revisions from trajectories.

The EvalResults here are built by hand: these tests check the selection rules on known inputs
(including GPU speedups that a CPU cannot measure); the smoke curation measures real ones.
"""

from __future__ import annotations

from kernelrl.data.curate.sft_select import (
    SelectConfig,
    count_tokens,
    format_completion,
    select_sft,
    sft_row,
    split_completion,
)
from kernelrl.data.curate.trajectories_to_sft import RevisionConfig, trajectories_to_sft
from kernelrl.data.schema import make_dataset
from kernelrl.env.result import EvalResult, Status

CODE = "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x{n}\n"
PROMPT = [{"role": "user", "content": "write a kernel"}]


def completion(reasoning: str, n: int = 0) -> str:
    return f"<think>\n{reasoning}\n</think>\n\n```python\n{CODE.format(n=' * 1' * n)}```"


def result(
    status: Status = Status.CORRECT, speedup: float | None = None, checks: list[str] | None = None
) -> EvalResult:
    return EvalResult(
        task_id="t",
        backend="triton",
        status=status,
        checks_failed=checks or [],
        speedup_vs_eager=speedup,
        timing_meaningful=speedup is not None,
        device_name="NVIDIA H100" if speedup is not None else "cpu",
    )


def row(
    example_id: str, task: str, text: str, res: EvalResult | None, kind: str = "sample"
) -> dict:
    return sft_row(example_id, task, PROMPT, text, res, kind, 0, "test")


def test_split_and_format() -> None:
    reasoning, solution = split_completion(completion("think hard", 1))
    assert reasoning == "think hard" and "class ModelNew" in solution
    prose, code = split_completion("Plan: one kernel.\n\n```python\n" + CODE.format(n="") + "```")
    assert prose == "Plan: one kernel." and code is not None
    assert split_completion("no code at all")[1] is None
    assert format_completion("r", "x = 1\n").startswith(
        "<think>\nr\n</think>\n\n```python\nx = 1\n```"
    )
    assert format_completion("r", "x = 1\n", "none") == "```python\nx = 1\n```"
    assert count_tokens("a, b c.") == 5


def test_selection_rules() -> None:
    rows = [
        row("ok_long", "a", completion("word " * 50, 1), result(speedup=1.5)),
        row("ok_short", "a", completion("short plan", 2), result(speedup=1.2)),
        row("ok_short_copy", "a", completion("short plan, again", 2), result(speedup=1.2)),
        row("slow", "a", completion("x", 3), result(speedup=0.8)),
        row("wrong", "a", completion("x", 4), result(Status.INCORRECT)),
        row(
            "cheat",
            "a",
            completion("x", 5),
            result(Status.INTEGRITY_VIOLATION, checks=["torch_fallback"]),
        ),
        row("checks", "a", completion("x", 6), result(speedup=3.0, checks=["side_stream"])),
        row("rambling", "b", completion("word " * 500, 7), result(speedup=2.0)),
        row("cpu", "b", completion("fine", 8), result()),
        row("unmeasured", "b", completion("fine", 9), None),
    ]
    config = SelectConfig(sft_min_speedup=1.0, sft_max_reasoning_tokens=200, sft_cap_per_task=1)
    kept, report = select_sft(make_dataset(rows, "sft"), config)
    reasons = {r.id: r.reason for r in report.removed}
    assert kept["id"] == ["ok_short", "cpu"]
    assert reasons == {
        "ok_long": "over_task_cap",  # concise first (ConCuR), although faster
        "ok_short_copy": "same_solution",
        "slow": "too_slow",
        "wrong": "not_correct:incorrect",
        "cheat": "not_correct:integrity_violation",
        "checks": "failed_checks",
        "rambling": "reasoning_too_long",
        "unmeasured": "not_evaluated",
    }
    # ranking by speed instead, and CPU results dropped when a speedup is required
    fastest = SelectConfig(
        sft_min_speedup=1.0,
        sft_cap_per_task=1,
        sft_rank_by="fastest",
        sft_require_meaningful_timing=True,
    )
    kept, report = select_sft(make_dataset(rows, "sft"), fastest)
    assert kept["id"] == ["ok_long", "rambling"]
    assert {r.id: r.reason for r in report.removed}["cpu"] == "timing_not_meaningful"


def trajectory(tid: str, turns: list[tuple[str, EvalResult]]) -> dict:
    return {
        "id": tid,
        "task_id": "t",
        "prompt": PROMPT,
        "turns": [
            {"completion": c, "feedback": f"feedback {i}", "reward": 0.0, "result": r.to_json()}
            for i, (c, r) in enumerate(turns)
        ],
        "origin": "test",
    }


def test_revisions_from_trajectories() -> None:
    data = make_dataset(
        [
            trajectory(
                "fix",
                [
                    (completion("a", 1), result(Status.COMPILE_ERROR)),
                    (completion("b", 2), result(Status.INCORRECT)),
                    (completion("c", 3), result()),
                ],
            ),
            trajectory(
                "faster",
                [
                    (completion("a", 1), result(speedup=1.0)),
                    (completion("b", 2), result(speedup=1.5)),
                ],
            ),
            trajectory(
                "same_speed",
                [
                    (completion("a", 1), result(speedup=1.0)),
                    (completion("b", 2), result(speedup=1.05)),
                ],
            ),
            trajectory(
                "never",
                [
                    (completion("a", 1), result(Status.INCORRECT)),
                    (completion("b", 2), result(Status.INTEGRITY_VIOLATION, checks=["x"])),
                ],
            ),
        ],
        "trajectories",
    )
    examples, report = trajectories_to_sft(
        data, RevisionConfig(revision_history="full", revision_min_improvement=1.1)
    )
    assert examples["id"] == ["fix/turn2", "faster/turn1"]
    assert sorted(r.id for r in report.removed) == ["never", "same_speed"]
    fix = examples[0]
    assert fix["kind"] == "revision" and fix["turn"] == 2 and fix["status"] == "correct"
    # full history: task prompt, then attempt / feedback for turns 0 and 1
    assert [m["role"] for m in fix["prompt"]] == ["user", "assistant", "user", "assistant", "user"]
    assert (
        fix["prompt"][2]["content"] == "feedback 0" and fix["prompt"][4]["content"] == "feedback 1"
    )
    assert fix["completion"][0]["content"].startswith("<think>\nc\n</think>")
    last, _ = trajectories_to_sft(data, RevisionConfig(revision_history="last"))
    assert [m["role"] for m in last[0]["prompt"]] == ["user", "assistant", "user"]
    assert last[0]["prompt"][2]["content"] == "feedback 1"
