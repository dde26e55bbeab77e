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


def scored_tasks(samples: Path) -> set[str]:
    """The tasks with at least one scored final answer in a sweep."""
    from kernelrl.env.result import is_scored
    from kernelrl.eval.metrics import last_view
    from kernelrl.eval.records import read_records

    return {r.task_id for r in last_view(read_records(samples)) if is_scored(r.result)}


def heldout_by_operator(
    samples: Path, operators: dict[str, str], code: str, tasks: set[str] | None = None
) -> dict[str, Counter[str]]:
    """operator -> attempts, correct answers and answers containing ``code`` (final turns;
    unscored ones left out, as in every rate of the report); only ``tasks`` where given."""
    from kernelrl.env.result import is_scored
    from kernelrl.eval.metrics import last_view
    from kernelrl.eval.records import read_records

    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for record in last_view(read_records(samples)):
        if not is_scored(record.result) or (tasks is not None and record.task_id not in tasks):
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


def by_operator(rows: list[dict[str, Any]], stages: list[str], k: int) -> dict[str, Any]:
    """From answer rows (``learning_answers``) of one seed and split: per core operator, the
    tasks scored at every stage (at least ``k`` scored answers at each: the tasks the report's
    paired differences use), their answers and correct answers per stage. A task some stage
    could not judge is left out of every stage's count, and named, so that each column of the
    table counts the same tasks."""
    answers: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    operator_of: dict[str, str] = {}
    for row in rows:
        operator_of[row["task_id"]] = row["operator"]
        if row["scored"]:
            answers[row["stage"]][row["task_id"]].append(row["correct"])
    paired = [t for t in sorted(operator_of) if all(len(answers[s][t]) >= k for s in stages)]
    operators: dict[str, dict[str, Any]] = {}
    for task in paired:
        entry = operators.setdefault(
            operator_of[task],
            {"tasks": 0, "attempts": dict.fromkeys(stages, 0), "correct": dict.fromkeys(stages, 0)},
        )
        entry["tasks"] += 1
        for stage in stages:
            entry["attempts"][stage] += len(answers[stage][task])
            entry["correct"][stage] += int(sum(answers[stage][task]))
    left_out = sorted(set(operator_of) - set(paired))
    return {"stages": stages, "operators": dict(sorted(operators.items())), "left_out": left_out}


def chain(values: dict[str, int], stages: list[str]) -> str:
    """The stages' values in order, as the table's columns read them: ``a -> b -> c``."""
    return " -> ".join(str(values[s]) for s in stages)


def per_stage(values: dict[str, int], stages: list[str]) -> str:
    """One number where every stage has it; otherwise one per stage, as the correct column reads
    (counts summed over seeds differ by stage when a stage was run by fewer seeds)."""
    found = {values[s] for s in stages}
    return str(found.pop()) if len(found) == 1 else chain(values, stages)


def operator_markdown(counts: dict[str, Any], labels: dict[str, str]) -> str:
    """``by_operator`` as a table; its totals row is the stages' correct answers on the paired
    tasks, the numerators of the report's correct@1."""
    stages = counts["stages"]
    names = " -> ".join(labels.get(s, s) for s in stages)
    lines = [
        f"| core operator | tasks | answers per stage | correct, {names} |",
        "| --- | ---: | ---: | --- |",
    ]
    total = {"tasks": 0, "attempts": dict.fromkeys(stages, 0), "correct": dict.fromkeys(stages, 0)}
    for operator, entry in counts["operators"].items():
        attempts = per_stage(entry["attempts"], stages)
        correct = chain(entry["correct"], stages)
        lines.append(f"| {operator} | {entry['tasks']} | {attempts} | {correct} |")
        total["tasks"] += entry["tasks"]
        for stage in stages:
            total["attempts"][stage] += entry["attempts"][stage]
            total["correct"][stage] += entry["correct"][stage]
    correct = chain(total["correct"], stages)
    attempts = per_stage(total["attempts"], stages)
    lines.append(f"| all | {total['tasks']} | {attempts} | {correct} |")
    if counts["left_out"]:
        lines += ["", f"Left out (not judged at every stage): {', '.join(counts['left_out'])}."]
    return "\n".join(lines) + "\n"


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
    sweeps = {stage: args.out / stage / "samples.jsonl" for stage in args.stages}
    for samples in sweeps.values():
        if not samples.exists():
            raise SystemExit(f"no held-out sweep {samples}")
    # Only the tasks every stage judged, as in the report's paired differences: a task one
    # stage lost to a harness error would count in the others' columns alone.
    scored = {stage: scored_tasks(samples) for stage, samples in sweeps.items()}
    paired = set.intersection(*scored.values())
    heldout = {s: heldout_by_operator(p, operators, args.code, paired) for s, p in sweeps.items()}
    left_out = sorted(set.union(*scored.values()) - paired)
    rollouts = None
    if args.rollouts:
        train = core_operators(tasks / "train" / "data.parquet")
        rollouts = rollouts_by_operator(args.rollouts, train)
    print(table(heldout, rollouts, args.code))
    if left_out:
        print(
            f"\nLeft out of the held-out columns (not judged at every stage): {', '.join(left_out)}"
        )


if __name__ == "__main__":
    main()
