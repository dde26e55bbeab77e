"""Exact and near-duplicate removal by what tasks compute, not by how they are worded.

Each record is described by its computation signature (``dedup_signature.signature``: the
canonical AST of ``Model`` and its helpers, the operator sequence, what ``forward`` returns,
and the shapes of the input generators). Docstrings, comments, annotations and names are not
part of any signal, so KernelBench's shared docstring template cannot make two problems alike.

- **exact duplicate**: same canonical computation and same shapes (a renamed, re-commented or
  reformatted copy).
- **near duplicate**: same operator sequence (layout ops such as ``.contiguous()`` aside), same
  returned value, same shapes, and a Jaccard similarity of the canonical computation's token
  n-grams at or above ``dedup_threshold``. The three exact gates are what keep conv2d and conv3d,
  depthwise and standard convolution, or an RNN's output and its hidden state apart; the
  similarity only confirms that the rest of the code is the same too.
- **shape variants** (same computation, other sizes; tall-skinny vs square matmul) are
  different kernel problems by default: ``dedup_shape_variants=True`` merges them (reason
  ``shape_variant``). Either way the report lists them in ``notes["shape_variants"]``.

The first record of a group (input order) is kept; the report names, for each removed record,
the kept one, the similarity and the reason. Candidates are grouped by their exact gates
(hash buckets), so the pairwise similarity only runs inside a bucket: linear in the corpus.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datasets import Dataset
from rich.console import Console

from kernelrl.data.curate.dedup_signature import Signature, signature
from kernelrl.data.curate.report import StepReport, log_step, step_progress, timed
from kernelrl.data.curate.tokens import shingles


@dataclass
class DedupConfig:
    """The dedup step's recipe keys (parsed next to ``CurateConfig``)."""

    dedup_threshold: float = field(
        default=0.8,
        metadata={"help": "Jaccard of computation n-grams for near duplicates (same ops/shapes)"},
    )
    dedup_ngram: int = field(
        default=5, metadata={"help": "n of the computation's token n-grams compared"}
    )
    dedup_shape_variants: bool = field(
        default=False,
        metadata={"help": "merge tasks with the same computation at other sizes (off: kept)"},
    )


def jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


@dataclass
class _Kept:
    id: str
    signature: Signature
    grams: set[str]


def dedup(
    dataset: Dataset,
    config: DedupConfig | None = None,
    text_field: str = "source",
    console: Console | None = None,
    step_name: str = "dedup",
) -> tuple[Dataset, StepReport]:
    """Drop exact and near duplicates of the computation in ``text_field``, keep the first."""
    config = config or DedupConfig()
    report = StepReport(step_name, count_in=len(dataset))
    keep: list[int] = []
    variants: list[dict[str, Any]] = []
    with timed(report), step_progress(console, step_name, len(dataset)) as progress:
        exact: dict[tuple[str, str], str] = {}  # (computation, shapes) -> kept id
        structures: dict[str, _Kept] = {}  # structure (numbers blanked) -> first kept record
        buckets: dict[tuple[Any, ...], list[_Kept]] = {}
        for index, row in enumerate(progress.track(dataset)):
            record_id = row["id"]
            sig = signature(row[text_field] or "")
            if (sig.computation, sig.shapes) in exact:
                other = exact[(sig.computation, sig.shapes)]
                report.remove(
                    record_id,
                    "exact_duplicate",
                    f"same computation and shapes as {other}",
                    duplicate_of=other,
                    similarity=1.0,
                )
                continue
            twin = structures.get(sig.structure)
            if twin is not None and config.dedup_shape_variants:
                report.remove(
                    record_id,
                    "shape_variant",
                    f"same computation as {twin.id} at other sizes ({sig.shapes_text})",
                    duplicate_of=twin.id,
                    similarity=1.0,
                )
                continue
            grams = shingles(sig.tokens, config.dedup_ngram)
            key = _gates(sig, config.dedup_shape_variants)
            best: tuple[float, str] | None = None
            for kept in buckets.get(key, []):
                similarity = jaccard(grams, kept.grams)
                if similarity >= config.dedup_threshold and (best is None or similarity > best[0]):
                    best = (similarity, kept.id)
            if best is not None:
                gates = (
                    "ops, output and literals"
                    if config.dedup_shape_variants
                    else ("ops, output, numbers and shapes")
                )
                report.remove(
                    record_id,
                    "near_duplicate",
                    f"same {gates} as {best[1]}; Jaccard {best[0]:.2f} of computation "
                    f"{config.dedup_ngram}-grams",
                    duplicate_of=best[1],
                    similarity=round(best[0], 4),
                )
                continue
            if twin is not None:  # kept: a shape variant of an earlier record
                variants.append(
                    {"id": record_id, "same_computation_as": twin.id, "shapes": sig.shapes_text}
                )
            mine = _Kept(record_id, sig, grams)
            exact[(sig.computation, sig.shapes)] = record_id
            structures.setdefault(sig.structure, mine)
            buckets.setdefault(key, []).append(mine)
            keep.append(index)
    result = dataset.select(keep)
    report.count_out = len(result)
    report.notes["shape_variants"] = variants
    report.notes["shape_variants_merged"] = config.dedup_shape_variants
    log_step(report, console)
    return result, report


def _gates(sig: Signature, shape_variants: bool) -> tuple[Any, ...]:
    """What near duplicates must share exactly; sizes only when shape variants stay apart."""
    if shape_variants:
        return (sig.ops, sig.returns, sig.flags)
    return (sig.ops, sig.returns, sig.flags, sig.numbers, sig.shapes)


def duplicate_pairs(report: StepReport) -> list[dict[str, Any]]:
    """(removed, kept, similarity) for every duplicate the step removed."""
    return [{"removed": r.id, **r.data} for r in report.removed]


def write_dedup_report(report: StepReport, path: Path) -> Path:
    """A markdown listing: every removed record, its kept twin, similarity and reason; and the
    shape variants (same computation, other sizes) with what decided about them."""
    lines = [
        f"# Deduplication: {report.count_in} records in, {report.count_out} kept, "
        f"{len(report.removed)} removed",
        "",
        "## Removed",
        "",
    ]
    if report.removed:
        lines += [
            "| removed | kept | similarity | reason | why |",
            "| --- | --- | --- | --- | --- |",
        ]
        lines += [
            f"| {r.id} | {r.data.get('duplicate_of', '')} | {r.data.get('similarity', 0):.2f} "
            f"| {r.reason} | {r.detail} |"
            for r in report.removed
        ]
    else:
        lines.append("None.")
    variants = report.notes.get("shape_variants", [])
    merged = report.notes.get("shape_variants_merged", False)
    lines += [
        "",
        "## Shape variants: same computation, other sizes "
        + ("(merged: `dedup_shape_variants: true`)" if merged else "(kept: the default)"),
        "",
    ]
    if variants:
        lines += ["| kept | same computation as | its shapes |", "| --- | --- | --- |"]
        lines += [f"| {v['id']} | {v['same_computation_as']} | `{v['shapes']}` |" for v in variants]
    else:
        lines.append("None." if not merged else "Listed above as `shape_variant` removals.")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path
