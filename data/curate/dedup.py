"""Exact and near-duplicate removal: normalised tokens, MinHash LSH (``datasketch``).

Records are compared on their normalised token streams (``tokens.normalized_tokens``), so
renamed variables, other comments or other formatting do not hide a copy. Exact duplicates
share the hash of that stream. Near duplicates are found with MinHash LSH over token n-grams;
every LSH candidate is confirmed with the exact Jaccard similarity of the n-gram sets (LSH only
proposes), so the threshold means what it says. The first record of a group (input order) is
kept; the report names, for each removed record, the kept one and the similarity.

Calibration: KernelBench-format files hold a few dozen tokens of content, so two different
single-operator tasks can share much of their text. Among the 31 bundled tasks the highest
Jaccard similarity of two different tasks is 0.75 (row sum vs row softmax, 5-grams), hence the
default threshold of 0.8; renamed copies and copies at other sizes are exact duplicates after
normalisation.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from datasets import Dataset
from datasketch import MinHash, MinHashLSH
from rich.console import Console

from kernelrl.data.curate.report import StepReport, log_step, timed
from kernelrl.data.curate.tokens import normalized_tokens, shingles


@dataclass
class DedupConfig:
    threshold: float = 0.8  # Jaccard similarity of token n-gram sets at or above which = duplicate
    ngram: int = 5
    num_perm: int = 128
    normalize_numbers: bool = False  # True: tasks differing only in sizes count as duplicates
    seed: int = 1


def jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def dedup(
    dataset: Dataset,
    config: DedupConfig | None = None,
    text_field: str = "source",
    console: Console | None = None,
    step_name: str = "dedup",
) -> tuple[Dataset, StepReport]:
    """Drop exact and near duplicates of ``text_field``, keeping the first of each group."""
    config = config or DedupConfig()
    report = StepReport(step_name, count_in=len(dataset))
    keep: list[int] = []
    with timed(report):
        lsh = MinHashLSH(threshold=config.threshold, num_perm=config.num_perm)
        exact: dict[str, str] = {}
        grams: dict[str, set[str]] = {}  # LSH key (the row index) -> n-grams of a kept record
        ids: dict[str, str] = {}
        for index, row in enumerate(dataset):
            record_id = row["id"]
            tokens = normalized_tokens(row[text_field] or "", config.normalize_numbers)
            digest = hashlib.sha256(" ".join(tokens).encode()).hexdigest()
            if digest in exact:
                report.remove(
                    record_id,
                    "exact_duplicate",
                    f"same normalised tokens as {exact[digest]}",
                    duplicate_of=exact[digest],
                    similarity=1.0,
                )
                continue
            mine = shingles(tokens, config.ngram)
            signature = MinHash(num_perm=config.num_perm, seed=config.seed)
            signature.update_batch([g.encode() for g in mine])
            best: tuple[float, str] | None = None
            for candidate in lsh.query(signature):
                similarity = jaccard(mine, grams[candidate])
                if similarity >= config.threshold and (best is None or similarity > best[0]):
                    best = (similarity, ids[candidate])
            if best is not None:
                report.remove(
                    record_id,
                    "near_duplicate",
                    f"Jaccard {best[0]:.2f} of token {config.ngram}-grams with {best[1]}",
                    duplicate_of=best[1],
                    similarity=round(best[0], 4),
                )
                continue
            exact[digest] = record_id
            grams[str(index)], ids[str(index)] = mine, record_id
            lsh.insert(str(index), signature)
            keep.append(index)
    result = dataset.select(keep)
    report.count_out = len(result)
    log_step(report, console)
    return result, report


def duplicate_pairs(report: StepReport) -> list[dict[str, Any]]:
    """(removed, kept, similarity) for every duplicate the step removed."""
    return [{"removed": r.id, **r.data} for r in report.removed]
