"""Where RL gained and where it lost, by the operator each synthetic task is built around.

The held-out means of ``learning.py`` say whether RL helped; this says where: for each core
operator (a softmax, a norm, a reduction; pointwise chains by their family), the correct
held-out answers of each stage and how many of them use a given piece of code (``--code``,
default ``tl.log(``), and, from an RL run's saved rollouts, how often its train answers were
correct in the first and second half of its steps and how many groups held both a correct and
an incorrect answer (the groups that give TRLOO a gradient).

    python benchmarks/learning_families.py runs/bench/learning --stages eval_sft eval_rl_gpu2 \\
        --rollouts runs/bench/gpu_rl3
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any


def core_operators(tasks_parquet: Path) -> dict[str, str]:
    """task id -> the operator its graph is built around (its family where there is none)."""
    import pyarrow.parquet as pq

    operators = {}
    for row in pq.read_table(tasks_parquet, columns=["id", "graph", "family"]).to_pylist():
        core = (json.loads(row["graph"]) if row["graph"] else {}).get("core")
        operators[row["id"]] = core["kind"] if core else row["family"]
    return operators


def heldout_by_operator(
    samples: Path, operators: dict[str, str], code: str
) -> dict[str, Counter[str]]:
    """operator -> attempts, correct answers and answers containing ``code`` (final turns;
    unscored ones left out, as in every rate of the report)."""
    from kernelrl.env.result import is_scored
    from kernelrl.eval.metrics import last_view
    from kernelrl.eval.records import read_records

    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for record in last_view(read_records(samples)):
        if not is_scored(record.result):
            continue
        count = counts[operators[record.task_id]]
        count["attempts"] += 1
        count["correct"] += bool(record.result.correct)
        count["code"] += code in record.completion
    return counts


def rollouts_by_operator(run: Path, operators: dict[str, str]) -> dict[str, Counter[str]]:
    """operator -> correct train answers in each half of the run's steps, and its groups (one
    task's samples in one step) with and without a correct-and-incorrect mix. Answers whose
    evaluation failed on our side (no result, ``harness_error``) are left out: they were not
    rewarded either."""
    from kernelrl.env.result import EvalResult, Status, is_scored

    records = [
        json.loads(line)
        for path in sorted((run / "rollouts").glob("rank*.jsonl"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]
    if not records:
        raise SystemExit(f"no rollouts in {run / 'rollouts'} (save_rollouts: true)")
    steps = sorted({r["step"] for r in records})
    middle = steps[len(steps) // 2]
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    groups: dict[tuple[int, str], list[bool]] = defaultdict(list)
    for record in records:
        result = record["turns"][-1]["result"]
        result = None if result is None else EvalResult.from_dict(result)
        if not is_scored(result):
            continue
        correct = result.status is Status.CORRECT
        half = "first" if record["step"] < middle else "second"
        count = counts[operators[record["task_id"]]]
        count[f"{half}_attempts"] += 1
        count[f"{half}_correct"] += correct
        groups[(record["step"], record["task_id"])].append(correct)
    for (_, task_id), answers in groups.items():
        count = counts[operators[task_id]]
        count["groups"] += 1
        count["mixed_groups"] += 0 < sum(answers) < len(answers)
    return counts


def table(
    heldout: dict[str, dict[str, Counter[str]]],
    rollouts: dict[str, Counter[str]] | None,
    code: str,
) -> str:
    stages = list(heldout)
    operators = sorted({op for counts in heldout.values() for op in counts})
    header = ["core operator", "held-out attempts"]
    header += [f"correct, {' -> '.join(stages)}", f"`{code}`, {' -> '.join(stages)}"]
    if rollouts is not None:
        header += ["train rollouts correct, first / second half", "groups with a mix"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for op in operators:
        first = heldout[stages[0]][op]
        row: list[Any] = [op, first["attempts"]]
        row.append(" -> ".join(str(heldout[s][op]["correct"]) for s in stages))
        row.append(" -> ".join(str(heldout[s][op]["code"]) for s in stages))
        if rollouts is not None:
            r = rollouts.get(op, Counter())
            row.append(
                f"{r['first_correct']} of {r['first_attempts']} / "
                f"{r['second_correct']} of {r['second_attempts']}"
            )
            row.append(f"{r['mixed_groups']} of {r['groups']}")
        lines.append("| " + " | ".join(str(cell) for cell in row) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the learning benchmark's --out folder")
    parser.add_argument("--stages", nargs="+", default=["eval_sft", "eval_rl"])
    parser.add_argument("--rollouts", type=Path, help="an RL run folder with rollouts/")
    parser.add_argument("--code", default="tl.log(", help="count answers containing this")
    args = parser.parse_args(argv)
    tasks = args.out / "synth" / "tasks"
    heldout_tasks = tasks / "heldout" / "data.parquet"
    if not heldout_tasks.exists():
        raise SystemExit(
            f"no synthetic tasks under {tasks}: the synthesis's folder (synth/) of the run that "
            "wrote the sweeps, copied into OUT where the sweeps were fetched without it"
        )
    operators = core_operators(heldout_tasks)
    heldout = {}
    for stage in args.stages:
        samples = args.out / stage / "samples.jsonl"
        if not samples.exists():
            raise SystemExit(f"no held-out sweep {samples}")
        heldout[stage] = heldout_by_operator(samples, operators, args.code)
    rollouts = None
    if args.rollouts:
        train = core_operators(tasks / "train" / "data.parquet")
        rollouts = rollouts_by_operator(args.rollouts, train)
    print(table(heldout, rollouts, args.code))


if __name__ == "__main__":
    main()
