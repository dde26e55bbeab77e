"""Every figure of the learning benchmark's report, recomputed from ``answers.jsonl.gz`` alone;
and the runs of several seeds, made in separate sessions, pooled.

    python benchmarks/learning_recompute.py RUN [RUN ...] --check
    python benchmarks/learning_recompute.py SEED1 SEED2 SEED3 SEED4 --out benchmarks/results/X

``RUN``: a folder holding ``answers.jsonl.gz`` (a run's ``--out`` or its ``--results``).
``--check`` recomputes each folder's figures from its answers (``learning_figures.figures``,
with the bootstrap settings its ``summary.json`` records) and compares them with what the
benchmark wrote there; any difference is printed and the exit status is 1. ``--out`` pools
the folders' answers (one seed each: a seed found in two folders is refused) and writes the
pooled figures: ``summary.json``, ``table.md`` (RL - SFT per seed and pooled, each seed's
table, the KernelBench set's), ``families.md`` (per seed, and summed over seeds) and the
concatenated ``answers.jsonl.gz``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning_answers import ANSWERS_FILE, read_answers, write_answers  # noqa: E402
from learning_families import operator_markdown  # noqa: E402
from learning_figures import TABLE_RESAMPLES, TABLE_SEED, figures  # noqa: E402
from learning_output import pooled_markdown  # noqa: E402
from learning_report import POOLED_RESAMPLES, POOLED_SEED, markdown  # noqa: E402

#: The figures a run's ``summary.json`` holds and the recomputation must reproduce.
COMPARED = ("split", "k", "per_seed", "pooled", "kernelbench", "families")
LABELS = {"base": "before SFT", "sft": "after SFT", "rl": "after RL"}


def normalised(value: Any) -> Any:
    """As JSON would store it (tuple -> list, int keys -> str), for comparison."""
    return json.loads(json.dumps(value))


def differences(written: Any, recomputed: Any, where: str = "") -> list[str]:
    """Where two JSON values differ, as paths (the first few of each branch)."""
    if isinstance(written, dict) and isinstance(recomputed, dict):
        found = []
        for key in sorted(set(written) | set(recomputed)):
            if key not in written or key not in recomputed:
                found.append(
                    f"{where}/{key}: only in the {'recomputation' if key in recomputed else 'summary'}"
                )
            else:
                found += differences(written[key], recomputed[key], f"{where}/{key}")
        return found
    if (
        isinstance(written, list)
        and isinstance(recomputed, list)
        and len(written) == len(recomputed)
    ):
        return [
            d
            for i, (a, b) in enumerate(zip(written, recomputed, strict=True))
            for d in differences(a, b, f"{where}[{i}]")
        ]
    return (
        []
        if written == recomputed
        else [f"{where}: {written!r} written, {recomputed!r} recomputed"]
    )


def bootstrap_settings(summary: dict[str, Any]) -> dict[str, int]:
    """The bootstrap a summary says it used; the defaults for a summary that predates the record."""
    recorded = summary.get("bootstrap", {})
    table, pooled = recorded.get("table", {}), recorded.get("pooled", {})
    return {
        "resamples": table.get("resamples", TABLE_RESAMPLES),
        "table_seed": table.get("seed", TABLE_SEED),
        "pooled_resamples": pooled.get("resamples", POOLED_RESAMPLES),
        "pooled_seed": pooled.get("seed", POOLED_SEED),
    }


def check(folder: Path) -> list[str]:
    """What the benchmark wrote in ``folder`` and the recomputation disagree on (empty: none)."""
    summary = json.loads((folder / "summary.json").read_text())
    recomputed = normalised(
        figures(read_answers(folder / ANSWERS_FILE), **bootstrap_settings(summary))
    )
    found = []
    for key in COMPARED:
        if key not in summary:
            found.append(f"/{key}: not in {folder / 'summary.json'}")
        else:
            found += differences(summary[key], recomputed[key], f"/{key}")
    return found


def pooled_rows(folders: list[Path]) -> list[dict[str, Any]]:
    """Every folder's answers, one seed per folder; a seed found twice is refused."""
    rows: list[dict[str, Any]] = []
    owner: dict[int, Path] = {}
    for folder in folders:
        folder_rows = read_answers(folder / ANSWERS_FILE)
        for seed in sorted({r["seed"] for r in folder_rows}):
            if seed in owner:
                raise SystemExit(
                    f"seed {seed} is in {owner[seed]} and in {folder}: one run per seed"
                )
            owner[seed] = folder
        rows += folder_rows
    return rows


def summed_families(families: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The by-operator counts of every seed, added up (each seed's paired tasks)."""
    stages: list[str] = []
    total: dict[str, dict[str, Any]] = {}
    left_out = []
    for seed, counts in families.items():
        stages += [s for s in counts["stages"] if s not in stages]
        left_out += [f"{task} (seed {seed})" for task in counts["left_out"]]
        for operator, entry in counts["operators"].items():
            into = total.setdefault(operator, {"tasks": 0, "attempts": {}, "correct": {}})
            into["tasks"] += entry["tasks"]
            for key in ("attempts", "correct"):
                for stage, value in entry[key].items():
                    into[key][stage] = into[key].get(stage, 0) + value
    return {"stages": stages, "operators": dict(sorted(total.items())), "left_out": left_out}


def shared_settings(folders: list[Path]) -> dict[str, int]:
    """The bootstrap settings the folders' summaries record, which must agree (a per-seed table
    recomputed with other draws would differ from the one its run reported)."""
    found = set()
    for folder in folders:
        path = folder / "summary.json"
        summary = json.loads(path.read_text()) if path.exists() else {}
        found.add(tuple(sorted(bootstrap_settings(summary).items())))
    if len(found) > 1:
        raise SystemExit(f"the folders' summaries record different bootstraps: {sorted(found)}")
    return dict(found.pop())


def write_pooled(folders: list[Path], out: Path) -> dict[str, Any]:
    """The pooled figures of every folder's answers, written to ``out``: runs made in separate
    sessions become one result without anything but their answers."""
    rows = pooled_rows(folders)
    settings = shared_settings(folders)
    found = normalised(figures(rows, **settings))
    found["folders"] = [str(f) for f in folders]
    found["bootstrap"] = {
        "table": {"resamples": settings["resamples"], "seed": settings["table_seed"]},
        "pooled": {"resamples": settings["pooled_resamples"], "seed": settings["pooled_seed"]},
    }
    out.mkdir(parents=True, exist_ok=True)
    write_answers(out / ANSWERS_FILE, rows)
    (out / "summary.json").write_text(json.dumps(found, indent=1))
    text = pooled_markdown(found["pooled"]) if found["pooled"] else "No seed has both SFT and RL.\n"
    for seed, table in found["per_seed"].items():
        text += f"\nSeed {seed}, held-out ({found['split']}):\n\n" + markdown(table, LABELS, {})
    for seed, table in found["kernelbench"].items():
        body = (
            table["error"] + "\n"
            if "error" in table
            else markdown(table, LABELS, {}, "KernelBench")
        )
        text += f"\nSeed {seed}, KernelBench level-1 set:\n\n" + body
    (out / "table.md").write_text(text)
    families = "".join(
        f"Seed {seed}:\n\n{operator_markdown(counts, LABELS)}\n"
        for seed, counts in found["families"].items()
    )
    families += "All seeds (tasks counted once per seed):\n\n" + operator_markdown(
        summed_families(found["families"]), LABELS
    )
    (out / "families.md").write_text(families)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="folders holding answers.jsonl.gz")
    parser.add_argument("--check", action="store_true", help="compare with each summary.json")
    parser.add_argument("--out", type=Path, help="write the pooled figures here")
    args = parser.parse_args(argv)
    missing = [str(f) for f in args.folders if not (f / ANSWERS_FILE).exists()]
    if missing:
        raise SystemExit(f"no {ANSWERS_FILE} in {', '.join(missing)}")
    if not args.check and args.out is None:
        raise SystemExit("nothing to do: --check, --out, or both")
    status = 0
    if args.check:
        for folder in args.folders:
            found = check(folder)
            print(
                f"{folder}: {'every figure recomputed' if not found else f'{len(found)} differences'}"
            )
            for line in found[:20]:
                print(f"  {line}")
            status |= bool(found)
    if args.out is not None:
        pooled = write_pooled(args.folders, args.out)["pooled"]
        if pooled:
            print(
                f"RL - SFT pooled over seeds {pooled['seeds']}: {pooled['gain']:+.3f} "
                f"[{pooled['ci_low']:+.3f}, {pooled['ci_high']:+.3f}] -> {args.out}"
            )
    return status


if __name__ == "__main__":
    sys.exit(main())
