"""How much learning_v14's RL - SFT rests on the verdicts that two sweeps sharing one GPU
spoiled (benchmarks/README.md, "Learning benchmark"): the one task the harness could not
judge for SFT (out of GPU memory), and the seven answers flagged ``timing_unconfirmed`` alone.

    python benchmarks/results/learning_v14/sensitivity.py BENCH_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from learning_report import estimate  # noqa: E402

STAGES = ("eval_sft", "eval_rl_beyond_gpu_t1_g16")


def correct_by_task(samples: Path, timing_flags_correct: bool) -> dict[str, list[dict]]:
    """Each scored attempt's correctness; a ``timing_unconfirmed``-only flag counts as correct
    when asked (its outputs matched the reference on every input set before the timing)."""
    by_task: dict[str, list[dict]] = {}
    for line in samples.read_text().splitlines():
        record = json.loads(line)
        result = record["result"] or {}
        if result.get("status") == "harness_error":
            continue
        flagged = result.get("checks_failed") == ["timing_unconfirmed"]
        correct = result.get("status") == "correct" or (timing_flags_correct and flagged)
        by_task.setdefault(record["task_id"], []).append(
            {metric: 0.0 for metric in ("format_error", "token_limit", "compile", "integrity")}
            | {"correct": float(correct), "reward": 0.0}
        )
    return by_task


def main(bench: Path) -> None:
    print("| timing-only flags | the task SFT lost | tasks | SFT | RL | RL - SFT [95%] |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for flags_correct in (False, True):
        for missing in (None, 1.0, 0.0):
            runs = {s: correct_by_task(bench / s / "samples.jsonl", flags_correct) for s in STAGES}
            lost = sorted(set(runs[STAGES[1]]) - set(runs[STAGES[0]]))
            label = "left out" if missing is None else f"all {'correct' if missing else 'wrong'}"
            if missing is not None:
                for task in lost:
                    runs[STAGES[0]][task] = [{**runs[STAGES[1]][task][0], "correct": missing}] * 4
            table = estimate(runs, sorted(runs[STAGES[1]]), 4, 2000, 0)
            sft, rl = (table["stages"][s]["correct"]["value"] for s in STAGES)
            diff = table["differences"][f"{STAGES[1]} - {STAGES[0]}"]["correct"]
            low, high = diff["bootstrap"]
            print(
                f"| {'correct' if flags_correct else 'as judged'} | {label} "
                f"| {len(table['scored_tasks'])} | {sft:.3f} | {rl:.3f} "
                f"| {diff['value']:+.3f} [{low:.3f}, {high:.3f}] |"
            )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
