"""The learning benchmark's tasks: samples of the synthesis's splits as sweep folders, the SFT
rows, and the fixed KernelBench level-1 set.

Kept apart from the stages (``learning_bench``) so that which tasks a sweep sees, and how they
are drawn, can be read and tested on their own. Nothing here runs a model or a kernel.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from learning_run import RECIPES

#: The split label of each sweep folder's tasks in the answers (``learning_answers``).
SPLIT_OF_FOLDER = {
    "validation": "validation",
    "heldout": "heldout",
    "kernelbench": "kernelbench_level1",
    "rl_train": "train",
    "curriculum": "train",
}
#: A task id of the KernelBench set: its level-1 file stem after this prefix.
KERNELBENCH_PREFIX = "level1_"


def kernelbench_sources(kernelbench: Path | None) -> list[str]:
    """Decontamination sources: KernelBench levels 1-3 when a checkout is given (the repository
    or its KernelBench/ folder)."""
    from kernelrl.eval.benchmarks import kernelbench_levels_folder

    if kernelbench is None:
        return []
    levels = [kernelbench_levels_folder(kernelbench) / f"level{n}" for n in (1, 2, 3)]
    missing = [str(p) for p in levels if not p.is_dir()]
    if missing:
        raise SystemExit(f"--kernelbench: no {', '.join(missing)}")
    return [f"kernelbench:{p}" for p in levels]


def sample_tasks(parquet: Path, count: int, seed: int) -> list[dict[str, Any]]:
    """A seeded sample of a split, as even across families as the split allows."""
    import datasets

    return sample_rows(list(datasets.Dataset.from_parquet(str(parquet))), count, seed)


def sample_rows(rows: list[dict[str, Any]], count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` rows, seeded, taken from each family in turn: a sample whose rate is not
    dominated by the family the synthesis drew most of."""
    by_family: dict[str, list[dict[str, Any]]] = {}
    for row in sorted(rows, key=lambda r: r["id"]):
        by_family.setdefault(row["family"], []).append(row)
    rng = random.Random(seed)
    for family_rows in by_family.values():
        rng.shuffle(family_rows)
    picked: list[dict[str, Any]] = []
    while len(picked) < count and any(by_family.values()):
        for family in sorted(by_family):
            if by_family[family] and len(picked) < count:
                picked.append(by_family[family].pop())
    return picked


def write_task_folder(rows: list[dict[str, Any]], folder: Path) -> None:
    """The tasks as KernelBench-style files (``<id>.py``), what ``benchmark: folder`` reads."""
    folder.mkdir(parents=True, exist_ok=True)
    for row in rows:
        (folder / f"{row['id']}.py").write_text(row["source"])


def write_sft_data(synth_dir: Path, folder: Path) -> int:
    """The verified references with the prompt every stage uses (no system message, no
    one-shot example): the model is trained on exactly what it is later asked."""
    import datasets

    from kernelrl.prompts import prompt_builders

    builder = prompt_builders(RECIPES / "prompt.txt", system=None, one_shot=False)["triton"]
    tasks = datasets.Dataset.from_parquet(str(synth_dir / "tasks" / "train" / "data.parquet"))
    sources = dict(zip(tasks["id"], tasks["source"], strict=True))
    sft = datasets.Dataset.from_parquet(str(synth_dir / "sft" / "data.parquet"))
    rows = [
        {
            "task_id": row["task_id"],
            "prompt": builder.first_messages(sources[row["task_id"]]),
            "completion": row["completion"],
        }
        for row in sft
    ]
    (folder / "sft").mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_list(rows).to_parquet(str(folder / "sft" / "train.parquet"))
    return len(rows)


def task_operators(parquets: list[Path]) -> dict[str, str]:
    """task id -> the operator its graph is built around (its family where there is none): the
    unit of the by-operator tables, recorded with every answer so that they can be recomputed
    from the answers alone."""
    import pyarrow.parquet as pq

    operators = {}
    for parquet in parquets:
        if not parquet.exists():
            continue
        for row in pq.read_table(parquet, columns=["id", "graph", "family"]).to_pylist():
            core = (json.loads(row["graph"]) if row["graph"] else {}).get("core")
            operators[row["id"]] = core["kind"] if core else row["family"]
    return operators


def read_kernelbench_set(path: Path) -> dict[str, str]:
    """The fixed KernelBench level-1 set: level-1 file name -> the family it stands for. One
    ``FILE FAMILY`` a line; ``#`` starts a comment."""
    entries: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) != 2 or not words[0].endswith(".py"):
            raise SystemExit(f"{path}:{number}: expected 'FILE.py FAMILY', got {line.strip()!r}")
        entries[words[0]] = words[1]
    if not entries:
        raise SystemExit(f"{path}: no KernelBench task listed")
    return entries


def write_kernelbench_set(entries: dict[str, str], kernelbench: Path, folder: Path) -> list[str]:
    """The set's files copied from a KernelBench checkout (never from this repository) into a
    sweep folder as ``level1_<stem>.py``; the task ids, sorted. A missing file is refused by
    name: a set evaluated without one of its tasks is another set."""
    from kernelrl.eval.benchmarks import kernelbench_levels_folder

    level1 = kernelbench_levels_folder(kernelbench) / "level1"
    missing = [name for name in entries if not (level1 / name).is_file()]
    if missing:
        raise SystemExit(f"KernelBench set: no {', '.join(missing)} in {level1}")
    folder.mkdir(parents=True, exist_ok=True)
    ids = []
    for name in entries:
        task_id = KERNELBENCH_PREFIX + name.removesuffix(".py")
        (folder / f"{task_id}.py").write_text((level1 / name).read_text())
        ids.append(task_id)
    return sorted(ids)


def kernelbench_operators(entries: dict[str, str]) -> dict[str, str]:
    """task id -> family, for the KernelBench set's rows in the by-operator tables."""
    return {KERNELBENCH_PREFIX + name.removesuffix(".py"): fam for name, fam in entries.items()}
