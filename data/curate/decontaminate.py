"""Decontamination: remove records that overlap an evaluation benchmark (n-gram overlap).

Each record and each benchmark task become sets of n-grams of normalised tokens
(``tokens.normalized_tokens``: renamed variables, reformatting and other sizes do not hide a
copy). The overlap of a record with a benchmark task is the Jaccard similarity of their n-gram
sets with every n-gram weighted by its inverse document frequency over the benchmark,
``log(1 + N / df)``: the input-generation lines that half of KernelBench shares weigh little,
the lines that say which operators run weigh much, so a ReLU task is not flagged for looking
like KernelBench's Sigmoid task while a copy of either scores 1.0.

Why Jaccard and not containment (the share of the benchmark's n-grams found in the record, as
used for long web documents): records and benchmark tasks here are files of the same kind and
size, so a small task is almost "contained" in any larger task that uses the same operator
(softmax in attention). Containment in both directions is reported next to the score for the
reader. The calibration behind the default threshold: docs/decisions.md.

A record is removed when its best score reaches ``decontam_threshold``; the report keeps the
best match, the figures and the heaviest shared n-grams for every record above
``report_threshold``.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datasets import Dataset
from rich.console import Console

from kernelrl.data.curate.report import StepReport, log_step, step_progress, timed
from kernelrl.data.curate.tokens import normalized_tokens, shingles
from kernelrl.data.loaders import raw_rows


@dataclass
class DecontaminateConfig:
    """The decontamination step's recipe keys (parsed next to ``CurateConfig``)."""

    decontam_ngram: int = field(
        default=8, metadata={"help": "n of the token n-grams compared with the benchmark"}
    )
    decontam_threshold: float = field(
        default=0.7,
        metadata={"help": "IDF-weighted Jaccard at or above which a record is contaminated"},
    )
    # Fixed settings, not recipe keys.
    report_threshold: float = field(default=0.4, init=False)  # listed in the report, though kept
    normalize_numbers: bool = field(default=False, init=False)


class Benchmark:
    """The n-gram index of a set of benchmark tasks."""

    def __init__(self, tasks: list[tuple[str, str]], config: DecontaminateConfig) -> None:
        self.config = config
        self.ids = [task_id for task_id, _ in tasks]
        self.grams = [
            shingles(normalized_tokens(src, config.normalize_numbers), config.decontam_ngram)
            for _, src in tasks
        ]
        self.df: Counter[str] = Counter(g for grams in self.grams for g in grams)
        self.index: dict[str, list[int]] = {}
        for position, grams in enumerate(self.grams):
            for g in grams:
                self.index.setdefault(g, []).append(position)

    @classmethod
    def from_sources(cls, sources: list[Any], config: DecontaminateConfig) -> Benchmark:
        """Benchmark tasks from loader sources (a KernelBench checkout, a dataset, ...)."""
        tasks = []
        for source in sources:
            for row in raw_rows(source):
                if isinstance(row.get("source"), str):
                    tasks.append((str(row.get("id") or f"bench_{len(tasks)}"), row["source"]))
        if not tasks:
            raise ValueError(f"the benchmark sources {sources} hold no task")
        return cls(tasks, config)

    def weight(self, gram: str) -> float:
        return math.log(1.0 + len(self.ids) / max(self.df.get(gram, 0), 1))

    def best_match(self, source: str) -> dict[str, Any] | None:
        """The benchmark task the record overlaps most, with the overlap figures."""
        mine = shingles(
            normalized_tokens(source, self.config.normalize_numbers), self.config.decontam_ngram
        )
        candidates = Counter(p for g in mine for p in self.index.get(g, ()))
        if not mine or not candidates:
            return None
        own_weight = sum(self.weight(g) for g in mine)
        best: dict[str, Any] | None = None
        for position in candidates:
            theirs = self.grams[position]
            common = mine & theirs
            common_weight = sum(self.weight(g) for g in common)
            their_weight = sum(self.weight(g) for g in theirs)
            benchmark_in_record = common_weight / their_weight
            record_in_benchmark = common_weight / own_weight
            score = common_weight / (own_weight + their_weight - common_weight)
            if best is None or score > best["score"]:
                best = {
                    "benchmark_id": self.ids[position],
                    "score": round(score, 4),
                    "benchmark_in_record": round(benchmark_in_record, 4),
                    "record_in_benchmark": round(record_in_benchmark, 4),
                    "jaccard": round(len(common) / len(mine | theirs), 4),
                    "matched_ngrams": len(common),
                    "examples": sorted(common, key=lambda g: (-self.weight(g), g))[:3],
                }
        return best


def decontaminate(
    dataset: Dataset,
    benchmark: Benchmark,
    text_field: str = "source",
    console: Console | None = None,
) -> tuple[Dataset, StepReport]:
    """Drop records overlapping ``benchmark``; ``report.notes['overlaps']`` lists the matches."""
    config = benchmark.config
    report = StepReport("decontaminate", count_in=len(dataset))
    keep: list[int] = []
    overlaps: list[dict[str, Any]] = []
    with timed(report), step_progress(console, "decontaminate", len(dataset)) as progress:
        for index, row in enumerate(progress.track(dataset)):
            match = benchmark.best_match(row[text_field] or "")
            contaminated = match is not None and match["score"] >= config.decontam_threshold
            if match is not None and match["score"] >= min(
                config.report_threshold, config.decontam_threshold
            ):
                overlaps.append({"id": row["id"], "removed": contaminated, **match})
            if contaminated:
                report.remove(
                    row["id"],
                    "contaminated",
                    f"IDF-weighted Jaccard {match['score']:.2f} with benchmark task {match['benchmark_id']} "
                    f"({match['matched_ngrams']} shared {config.decontam_ngram}-grams, {match['benchmark_in_record']:.0%} of it in the record)",
                    **match,
                )
            else:
                keep.append(index)
        report.notes.update(
            benchmark_tasks=len(benchmark.ids),
            ngram=config.decontam_ngram,
            threshold=config.decontam_threshold,
            overlaps=overlaps,
        )
    result = dataset.select(keep)
    report.count_out = len(result)
    log_step(report, console)
    return result, report


def write_decontamination_report(report: StepReport, path: Path) -> None:
    """Markdown: what was removed, what came close, and why."""
    notes = report.notes
    lines = [
        "# Decontamination report",
        "",
        f"Benchmark: {notes.get('benchmark_tasks', 0)} tasks; token {notes.get('ngram')}-grams; "
        f"a record is removed at an IDF-weighted Jaccard similarity of {notes.get('threshold', 0):.2f} or more.",
        "",
        "| record | benchmark task | weighted Jaccard | bench in record | record in bench | plain Jaccard | removed |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for o in sorted(notes.get("overlaps", []), key=lambda o: -o["score"]):
        lines.append(
            f"| {o['id']} | {o['benchmark_id']} | {o['score']:.2f} | {o['benchmark_in_record']:.2f} | "
            f"{o['record_in_benchmark']:.2f} | {o['jaccard']:.2f} | {'yes' if o['removed'] else 'no'} |"
        )
    if not notes.get("overlaps"):
        lines.append("| (no record overlaps the benchmark) | | | | | | |")
    lines += ["", "Matched n-grams of removed records (highest weight first):", ""]
    for removal in report.removed:
        examples = "; ".join(f"`{g}`" for g in removal.data.get("examples", []))
        lines.append(f"- {removal.id} ~ {removal.data.get('benchmark_id')}: {examples}")
    path.write_text("\n".join(lines) + "\n")
    path.with_suffix(".json").write_text(json.dumps(notes.get("overlaps", []), indent=1))
