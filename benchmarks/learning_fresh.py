"""A fresh held-out split for the learning benchmark: tasks that no choice has seen.

The synthesis's own held-out split was evaluated in every run since learning_v11 and
the settings of later runs were chosen after seeing it, so it measures nothing new. This draws
new tasks from the same generator with another seed and keeps those that could have been in
the training synthesis's held-out split and are in none of its splits:

1. ``run_synthesis`` with the training synthesis's recipe (``recipe.json``: the same families,
   dtypes, chain lengths, sizes and reference tier), another ``seed``, ``num_tasks`` of it, no
   reference solutions, decontaminated against KernelBench where ``--kernelbench`` is given;
2. kept: chains longer than the reference tier (as the held-out split's), whose operator
   combination occurs in no split of the training synthesis (train, validation, held-out) and
   whose operators all occur in its train split (the held-out promise, ``data/synth/split``);
3. kept: not a duplicate of any training-synthesis task by computation signature, sizes aside
   (curation's ``dedup``, shape variants merged), and below the decontamination threshold of
   the recipe against every training-synthesis task (curation's ``decontaminate``);
4. ``--tasks`` of them, seeded and even across families (``learning_tasks.sample_rows``), each
   run in the sandbox (curation's ``validate``); one that fails there stops the command.

``OUT/data.parquet`` holds the chosen tasks, ``OUT/manifest.json`` the command, the counts of
every step and each task's sha256; ``learning.py --heldout-from OUT`` checks them before use.

    python benchmarks/learning_fresh.py --train-synth runs/bench/protocol_v1/base/synth \\
        --out runs/bench/protocol_v1/fresh --seed 1 --num-tasks 1500 --tasks 64 \\
        --kernelbench .kb/KernelBench
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from learning_tasks import kernelbench_sources, sample_rows

SPLITS = ("train", "validation", "heldout")
MANIFEST = "manifest.json"
DATA = "data.parquet"
#: Where a run folder keeps a copy of the fresh split it answers: the split travels with the
#: folder to any machine, and the report reads its tasks' operators from there.
FRESH_COPY = "fresh_heldout"


def fresh_parquet(folder: Path) -> Path:
    """Where a fresh split's tasks are: what the report reads their operators from."""
    return folder / DATA


def digest(source: str) -> str:
    """A task's fingerprint in the manifest: any change to its source changes it."""
    return hashlib.sha256(source.encode()).hexdigest()


def read_fresh(folder: Path) -> list[dict[str, Any]]:
    """The fresh split's tasks, each checked against the digest its manifest recorded."""
    import datasets

    manifest_path = folder / MANIFEST
    if not manifest_path.exists() or not fresh_parquet(folder).exists():
        raise SystemExit(f"--heldout-from: no {MANIFEST} and {DATA} in {folder}")
    expected = {t["id"]: t["sha256"] for t in json.loads(manifest_path.read_text())["tasks"]}
    rows = list(datasets.Dataset.from_parquet(str(fresh_parquet(folder))))
    found = {row["id"]: digest(row["source"]) for row in rows}
    if found != expected:
        changed = sorted(
            set(found) ^ set(expected) | {t for t in found if found[t] != expected.get(t)}
        )
        raise SystemExit(f"--heldout-from: {folder} differs from its manifest: {changed[:5]}")
    return rows


def synthesize(train_synth: Path, out: Path, seed: int, num_tasks: int, sources: list[str]) -> Path:
    """Step 1: the training synthesis's recipe with another seed, no references."""
    from kernelrl.data.synth.config import synth_config
    from kernelrl.data.synth.pipeline import run_synthesis

    keys = json.loads((train_synth / "recipe.json").read_text())
    keys.pop("command", None)
    if keys["seed"] == seed:
        raise SystemExit(f"--seed {seed} is the training synthesis's own seed")
    # no references and no sandbox sample: the chosen tasks are each run in the sandbox (step
    # 4), so the split does not depend on how the training synthesis sampled its own
    keys |= {"seed": seed, "num_tasks": num_tasks, "reference_solutions": 0, "sandbox_sample": 0}
    keys |= {"output_dir": str(out / "synth"), "benchmark_sources": sources}
    run_synthesis(synth_config(**keys))
    return out / "synth"


def load_splits(synth: Path) -> list[dict[str, Any]]:
    """Every task of a synthesis, whichever split holds it."""
    import datasets

    rows: list[dict[str, Any]] = []
    for split in SPLITS:
        rows += list(datasets.Dataset.from_parquet(str(synth / "tasks" / split / DATA)))
    return rows


def apart_from_training(
    fresh: list[dict[str, Any]], training: list[dict[str, Any]], min_pointwise: int
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Step 2: what could have been held out and was not drawn for training."""
    from kernelrl.data.synth.graph import pointwise_in

    seen = {row["combination"] for row in training}
    train_ops = {
        op for row in training if row["split"] == "train" for op in row["combination"].split(">")
    }
    counts: Counter[str] = Counter()
    kept = []
    for row in fresh:
        combination = row["combination"]
        if pointwise_in(combination) < min_pointwise:
            counts["within the reference tier"] += 1
        elif combination in seen:
            counts["combination in the training synthesis"] += 1
        elif not set(combination.split(">")) <= train_ops:
            counts["an operator never in training"] += 1
        else:
            kept.append(row)
    return kept, dict(counts)


def unlike_training(
    fresh: list[dict[str, Any]], training: list[dict[str, Any]], recipe: dict[str, Any]
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Step 3: no task of the training synthesis computes the same thing (any sizes) or
    shares enough of its text to count as a copy, by curation's own measures."""
    from datasets import Dataset

    from kernelrl.data.curate.decontaminate import Benchmark, DecontaminateConfig, decontaminate
    from kernelrl.data.curate.dedup import DedupConfig, dedup

    def columns(rows: list[dict[str, Any]]) -> Dataset:
        return Dataset.from_list([{"id": r["id"], "source": r["source"]} for r in rows])

    config = DedupConfig(
        dedup_threshold=recipe["dedup_threshold"],
        dedup_ngram=recipe["dedup_ngram"],
        dedup_shape_variants=True,
    )
    _, report = dedup(columns(training + fresh), config)
    training_ids = {row["id"] for row in training}
    duplicates = {r.id for r in report.removed if r.id not in training_ids}
    index = Benchmark(
        [(row["id"], row["source"]) for row in training],
        DecontaminateConfig(
            decontam_ngram=recipe["decontam_ngram"], decontam_threshold=recipe["decontam_threshold"]
        ),
    )
    candidates = [row for row in fresh if row["id"] not in duplicates]
    _, report = decontaminate(columns(candidates), index)
    copies = {r.id for r in report.removed}
    counts = {"duplicate of a training-synthesis task": len(duplicates)}
    counts["overlapping a training-synthesis task's text"] = len(copies)
    return [row for row in candidates if row["id"] not in copies], counts


def validate(rows: list[dict[str, Any]], seed: int) -> None:
    """Step 4's sandbox run of every chosen task; one that fails stops the command."""
    from datasets import Dataset

    from kernelrl.data.curate.validate import ValidateConfig, validate_tasks

    tasks = Dataset.from_list(rows)
    _, report = validate_tasks(tasks, ValidateConfig(validate_workers=2), device="cpu", seed=seed)
    if report.removed:
        failed = ", ".join(f"{r.id} ({r.reason})" for r in report.removed)
        raise SystemExit(f"fresh held-out tasks failed in the sandbox: {failed}")


def build(args: argparse.Namespace) -> dict[str, Any]:
    """The fresh split in ``args.out``; returns its manifest."""
    import datasets

    training = load_splits(args.train_synth)
    recipe = json.loads((args.train_synth / "recipe.json").read_text())
    # decontaminated against what the training synthesis was, or the checkout given here
    sources = kernelbench_sources(args.kernelbench) or recipe.get("benchmark_sources", [])
    synth = synthesize(args.train_synth, args.out, args.seed, args.num_tasks, sources)
    fresh = load_splits(synth)
    tier = recipe.get("reference_max_pointwise", 0)
    pool, removed = apart_from_training(fresh, training, tier + 1 if tier else 0)
    pool, more = unlike_training(pool, training, recipe)
    chosen = sample_rows(pool, args.tasks, args.seed)
    if len(chosen) < args.tasks:
        raise SystemExit(f"only {len(chosen)} fresh tasks left of {len(fresh)}: raise --num-tasks")
    validate(chosen, args.seed)
    chosen = [{**row, "split": "heldout_fresh"} for row in chosen]
    datasets.Dataset.from_list(chosen).to_parquet(str(fresh_parquet(args.out)))
    manifest = {
        "command": "python benchmarks/learning_fresh.py " + " ".join(args.argv),
        "seed": args.seed,
        "training_synthesis": {"seed": recipe["seed"], "tasks": len(training)},
        "drawn": len(fresh),
        "removed": removed | more,
        "pool": len(pool),
        "families": dict(Counter(row["family"] for row in chosen)),
        "tasks": [
            {
                "id": r["id"],
                "family": r["family"],
                "combination": r["combination"],
                "sha256": digest(r["source"]),
            }
            for r in sorted(chosen, key=lambda r: r["id"])
        ],
    }
    (args.out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--train-synth", type=Path, required=True, help="the training synthesis (synth/)"
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, required=True, help="the fresh tasks' seed")
    parser.add_argument(
        "--num-tasks", type=int, default=1500, help="tasks the fresh synthesis draws"
    )
    parser.add_argument("--tasks", type=int, default=64, help="tasks of the fresh split")
    parser.add_argument("--kernelbench", type=Path, default=None, help="a KernelBench checkout")
    args = parser.parse_args(words)
    args.argv = words
    if not (args.train_synth / "recipe.json").exists():
        raise SystemExit(f"--train-synth: no recipe.json in {args.train_synth}")
    if fresh_parquet(args.out).exists():
        raise SystemExit(f"{args.out} already holds a fresh split: a split is made once")
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = build(args)
    print(json.dumps({k: v for k, v in manifest.items() if k != "tasks"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
