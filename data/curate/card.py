"""The dataset card: README.md with HF ``configs`` metadata, counts and distributions.

Every figure in the card is computed from the saved datasets and the step reports of the run
that wrote them; nothing is typed in by hand.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from datasets import Dataset

from kernelrl.data.curate.report import StepReport

FRONT_MATTER = """---
configs:
{configs}
tags:
- kernelrl
- gpu-kernels
- {backend}
---
"""


def _counts_table(counts: Counter, header: str) -> list[str]:
    lines = [f"| {header} | count |", "| --- | ---: |"]
    for key, n in sorted(counts.items(), key=lambda kv: (-kv[1], str(kv[0]))):
        lines.append(f"| {key} | {n} |")
    return lines


def _stats(values: Iterable[float | None]) -> str:
    xs = [v for v in values if v is not None]
    if not xs:
        return "n/a"
    if len(xs) == 1:
        return f"n=1, value {xs[0]:.4g}"
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return f"n={len(xs)}, min {min(xs):.4g}, p25 {q[0]:.4g}, median {statistics.median(xs):.4g}, p75 {q[2]:.4g}, max {max(xs):.4g}"


def write_card(
    folder: Path,
    name: str,
    tasks: Dataset,
    sft: Dataset | None,
    reports: list[StepReport],
    plots: dict[str, Path],
    command: str = "",
    backend: str = "triton",
) -> Path:
    """Write ``README.md``: HF front matter, then one section per part of the run, each
    computed from the datasets and step reports it describes."""
    lines = _header_lines(name, tasks, sft, command, backend)
    lines += _step_lines(reports)
    lines += ["", "## Tasks", ""] + _task_lines(tasks)
    if sft is not None:
        lines += ["", "## SFT examples", ""] + _sft_lines(sft)
    lines += _dedup_lines(reports)
    if plots:
        lines += ["", "## Plots", ""]
        for key, path in plots.items():
            lines.append(f"![{key}]({path.relative_to(folder).as_posix()})")
    path = folder / "README.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _header_lines(
    name: str, tasks: Dataset, sft: Dataset | None, command: str, backend: str
) -> list[str]:
    """Front matter (the HF ``configs`` a loader reads), what the dataset is, how to rebuild
    it, and its contents."""
    configs = ["- config_name: tasks", "  data_files: tasks/*.parquet"]
    if sft is not None:
        configs += ["- config_name: sft", "  data_files: sft/*.parquet"]
    lines = [
        FRONT_MATTER.format(configs="\n".join(configs), backend=backend).rstrip("\n"),
        "",
        f"# {name}",
        "",
    ]
    lines += [
        "Curated with `kernelrl curate`: KernelBench-format RL tasks whose references were run in the",
        "environment's sandbox, deduplicated, decontaminated and tagged with difficulty"
        + (", plus SFT examples of measured, correct solutions." if sft is not None else "."),
        "",
    ]
    if command:
        lines += ["Reproduce:", "", "```bash", command, "```", ""]
    lines += [
        "## Contents",
        "",
        "| config | rows | file |",
        "| --- | ---: | --- |",
        f"| tasks | {len(tasks)} | tasks/*.parquet |",
    ]
    if sft is not None:
        lines.append(f"| sft | {len(sft)} | sft/*.parquet |")
    return lines


def _step_lines(reports: list[StepReport]) -> list[str]:
    """Counts in and out of every step, and every removed record with its reason."""
    lines = [
        "",
        "## Curation steps",
        "",
        "| step | in | out | removed | seconds |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for r in reports:
        lines.append(
            f"| {r.step} | {r.count_in} | {r.count_out} | {len(r.removed)} | {r.seconds:.1f} |"
        )
    removed = Counter((r.step, removal.reason) for r in reports for removal in r.removed)
    if removed:
        lines += [
            "",
            "Removed records by reason (details in `removed.jsonl`):",
            "",
            "| step | reason | count |",
            "| --- | --- | ---: |",
        ]
        for (step, reason), n in sorted(removed.items()):
            lines.append(f"| {step} | {reason} | {n} |")
        lines += ["", "| step | record | reason | detail |", "| --- | --- | --- | --- |"]
        for r in reports:
            for removal in r.removed:
                detail = removal.detail.replace("|", "\\|").replace("\n", " ")
                lines.append(f"| {r.step} | {removal.id} | {removal.reason} | {detail[:160]} |")
    return lines


def _task_lines(tasks: Dataset) -> list[str]:
    """Distributions of the tasks' tags and measurements, then one row per task."""
    if not len(tasks):
        return ["No task survived curation."]
    lines: list[str] = []
    for column, header in (
        ("category", "category"),
        ("difficulty", "difficulty"),
        ("runtime_bucket", "reference runtime"),
    ):
        lines += _counts_table(Counter(str(v) for v in tasks[column]), header) + [""]
    lines += _counts_table(
        Counter(c for cats in tasks["op_categories"] for c in (cats or [])), "operator category"
    ) + [""]
    lines += _counts_table(
        Counter("n/a" if v is None else str(v) for v in tasks["level"]), "level"
    ) + [""]
    devices = sorted({d for d in tasks["ref_device"] if d})
    lines.append(
        f"- reference median runtime (ms, on {', '.join(devices) or 'n/a'}): {_stats(tasks['ref_runtime_ms'])}"
    )
    lines.append(f"- operators per task: {_stats(tasks['num_ops'])}")
    if any(p is not None for p in tasks["pass_rate"]):
        k = next(k for k in tasks["pass_k"] if k)
        lines.append(f"- model pass rate (k={k}): {_stats(tasks['pass_rate'])}")
    lines += [
        "",
        "| id | category | ops | difficulty | ref ms |",
        "| --- | --- | --- | --- | ---: |",
    ]
    for row in tasks:
        runtime = f"{row['ref_runtime_ms']:.3f}" if row["ref_runtime_ms"] is not None else "-"
        lines.append(
            f"| {row['id']} | {row['category']} | {', '.join(row['ops'] or [])} | {row['difficulty']} | {runtime} |"
        )
    return lines


def _sft_lines(sft: Dataset) -> list[str]:
    """What the SFT examples are made of; speedups only where the timing means something."""
    if not len(sft):
        return ["No SFT example survived selection."]
    lines = _counts_table(Counter(sft["kind"]), "kind") + [""]
    lines += _counts_table(Counter(sft["task_id"]), "task") + [""]
    lines.append(f"- reasoning length (tokens): {_stats(sft['reasoning_tokens'])}")
    meaningful = [
        s for s, m in zip(sft["speedup_vs_eager"], sft["timing_meaningful"], strict=True) if m
    ]
    lines.append(f"- speedup vs eager (GPU-measured examples only): {_stats(meaningful)}")
    devices = sorted({d for d in sft["device_name"] if d})
    lines.append(f"- measured on: {', '.join(devices)}")
    return lines


def _dedup_lines(reports: list[StepReport]) -> list[str]:
    """Summaries of the deduplication and decontamination steps (their own reports hold the
    pairs)."""
    lines: list[str] = []
    dedup = next((r for r in reports if r.step == "dedup"), None)
    if dedup is not None:
        lines += [
            "",
            "## Deduplication",
            "",
            f"{len(dedup.removed)} of {dedup.count_in} records removed as duplicates of the same "
            f"computation; {len(dedup.notes.get('shape_variants', []))} shape variants (same "
            "computation, other sizes) "
            + ("merged" if dedup.notes.get("shape_variants_merged") else "kept")
            + "; see `dedup.md`.",
        ]
    decontam = next((r for r in reports if r.step == "decontaminate"), None)
    if decontam is not None:
        lines += [
            "",
            "## Decontamination",
            "",
            f"{len(decontam.removed)} of {decontam.count_in} records removed for overlapping "
            f"{decontam.notes.get('benchmark_tasks', 0)} benchmark tasks; see `decontamination.md`.",
        ]
    return lines
