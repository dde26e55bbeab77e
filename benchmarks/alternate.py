"""Two settings of a benchmark alternated on one machine, A B A B ..., each run in a process and
pool of its own, and what they measured side by side: each run's evaluation rate, verdicts and
speed-up spread per task, and for each pair B's rate over A's. The benchmark is the bundled
suite's throughput (``env_throughput.py``) or KernelBench's published sizes
(``kernelbench_harness.py``, kernelrl's phase).

A shared machine drifts between calls by more than most settings move (benchmarks/README.md
compares runs within a table only): alternating the two, and comparing each B with the A just
before it, is what lets a difference be put down to the setting rather than the hour.

    python benchmarks/alternate.py --pairs 2 --b=--no-move-local-memory --out OUT -- \\
        --device cuda --new-kernels --repeats 6 --tasks 31_conv2d_stride2_relu 18_matmul

    python benchmarks/alternate.py --bench harness --a=--no-admission-in-order --out OUT -- \\
        --kernelbench KB/KernelBench --phases kernelrl --shares kernelrl=1 --repeats 3

Everything after ``--`` goes to both settings; ``--a`` and ``--b`` add each one's own options
(quoted, as one argument). Each run's log and summary (and a throughput run's records,
``NAME.jsonl.gz``, what ``cluster_sizing.py`` reads) are kept in OUT beside ``side_by_side.md``,
the table this prints. The harness's rate is its kernelrl phase's over all repeats, and its
spread each task's over them.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shlex
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))
from kernelbench_harness import summarise_kernelrl  # noqa: E402

SCRIPTS = {"throughput": "env_throughput.py", "harness": "kernelbench_harness.py"}


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The alternation's own options, and the options both settings share (after ``--``)."""
    if "--" not in argv:
        raise SystemExit("alternate.py: give the benchmark's shared options after '--'")
    split = argv.index("--")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bench", choices=SCRIPTS, default="throughput")
    parser.add_argument("--a", default="", help="setting A's own options (default: none)")
    parser.add_argument("--b", default="", help="setting B's own options")
    parser.add_argument("--pairs", type=int, default=2, help="A-B pairs, run in turn")
    parser.add_argument("--out", default="runs/alternate", help="logs, summaries and the table")
    parser.add_argument(
        "--run-timeout-s", type=float, default=None, help="a run still going then is stopped"
    )
    args = parser.parse_args(argv[:split])
    if args.pairs < 1:
        parser.error(f"--pairs must be at least 1, not {args.pairs}")
    if args.a == args.b:
        parser.error("--a and --b are the same setting: nothing to compare")
    return args, argv[split + 1 :]


def run_order(pairs: int) -> list[str]:
    """The runs' labels in the order they run: a1 b1 a2 b2 ..."""
    return [f"{side}{pair}" for pair in range(1, pairs + 1) for side in "ab"]


def run_one(bench: str, label: str, options: list[str], out: Path, timeout_s: float | None) -> dict:
    """One run of the benchmark; its summary as ``env_throughput.py`` writes it, or why there is
    none."""
    if bench == "throughput":  # its records too, as cluster_sizing.py reads them
        summary_path = out / f"{label}.json"
        where = ["--summary-out", str(summary_path), "--json-out", str(out / f"{label}.jsonl")]
    else:  # the harness writes its results.json into a folder of its own
        summary_path = out / label / "results.json"
        where = ["--out", str(out / label)]
    command = [sys.executable, str(BENCHMARKS / SCRIPTS[bench]), *options, *where]
    started = time.perf_counter()
    with (out / f"{label}.log").open("w") as log:
        log.write(shlex.join(command) + "\n")
        log.flush()
        try:
            code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s)
            failed = f"exit status {code.returncode}" if code.returncode else ""
        except subprocess.TimeoutExpired:
            failed = f"stopped after {timeout_s:.0f} s"
    wall = time.perf_counter() - started
    print(f"{label}: {failed or 'done'} in {wall:.0f} s", flush=True)
    compress(out / f"{label}.jsonl")
    if failed or not summary_path.exists():
        return {"failed": failed or "no summary written"}
    summary = json.loads(summary_path.read_text())
    return summary if bench == "throughput" else harness_summary(summary)


def compress(records: Path) -> None:
    """A run's records gzipped beside its summary (``NAME.jsonl.gz``), where
    ``cluster_sizing.py`` reads them; a run that wrote none leaves nothing."""
    if records.exists():
        with records.open("rb") as plain, gzip.open(f"{records}.gz", "wb") as packed:
            shutil.copyfileobj(plain, packed)
        records.unlink()


def harness_summary(results: dict) -> dict:
    """The harness's ``results.json`` in the throughput benchmark's terms: the kernelrl phase's
    rate over all repeats, its verdicts, each task's speed-up spread over its repeats, and how
    long its evaluations waited for GPU memory."""
    runs = {stem: row.get("kernelrl") or [] for stem, row in results["rows"].items()}
    spreads = {stem: summarise_kernelrl(r)["spread"] for stem, r in runs.items()}
    rate = results["totals"].get("kernelrl evals/min (pool warm)", "-")
    waits = [r.get("phase_seconds", {}).get("admission", 0.0) for rs in runs.values() for r in rs]
    return {
        "warm": {
            "evals_per_min": None if rate == "-" else float(rate),
            "statuses": dict(Counter(r["status"] for rs in runs.values() for r in rs)),
            "spreads": {stem: s for stem, s in spreads.items() if s is not None},
            "admission_s": {"sum": sum(waits), "longest": max(waits, default=0.0)},
        }
    }


def side_by_side(summaries: dict[str, dict]) -> str:
    """A markdown table: a row per run, in the order they ran, then each pair's rate ratio."""
    tasks = sorted({t for s in summaries.values() for t in s.get("warm", {}).get("spreads", {})})
    head = ["run", "evaluations/min", "verdicts", *(f"`{t}` spread" for t in tasks)]
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    for label, summary in summaries.items():
        if "failed" in summary:
            lines.append(f"| {label} | {summary['failed']} |" + " |" * (len(head) - 2))
            continue
        warm = summary["warm"]
        verdicts = ", ".join(f"{n} {s}" for s, n in sorted(warm["statuses"].items()))
        spreads = [warm.get("spreads", {}).get(t) for t in tasks]
        rate = warm["evals_per_min"]
        cells = [label, "-" if rate is None else f"{rate:.1f}", verdicts]
        cells += ["-" if s is None else f"{s:.3f}" for s in spreads]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for pair in range(1, len(summaries) // 2 + 1):
        a, b = summaries.get(f"a{pair}", {}), summaries.get(f"b{pair}", {})
        rates = [run.get("warm", {}).get("evals_per_min") for run in (a, b)]
        if None in rates:
            lines.append(f"pair {pair}: no ratio, a run of it failed or evaluated nothing")
        else:
            lines.append(f"pair {pair}: B's rate / A's {rates[1] / rates[0]:.3f}")
    for label, summary in summaries.items():  # what the admission's order can change
        waits = summary.get("warm", {}).get("admission_s")
        if waits:
            lines.append(
                f"{label}: waited for GPU memory {waits['sum']:.1f} s in all "
                f"(longest {waits['longest']:.1f} s)"
            )
    for label, summary in summaries.items():  # with the move on: where the child moved it
        if summary.get("options", {}).get("move_local_memory"):
            moved = summary["warm"].get("local_memory_moved", {})
            said = ", ".join(f"`{t}` {n}" for t, n in sorted(moved.items())) or "no evaluation"
            lines.append(f"{label}: local memory moved in {said}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    args, shared = parse_args(sys.argv[1:] if argv is None else argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = {"a": shlex.split(args.a), "b": shlex.split(args.b)}
    print(f"A: {args.a or '(shared options only)'}; B: {args.b}; shared: {shlex.join(shared)}")
    summaries = {
        label: run_one(args.bench, label, shared + settings[label[0]], out, args.run_timeout_s)
        for label in run_order(args.pairs)
    }
    table = side_by_side(summaries)
    (out / "side_by_side.md").write_text(table)
    print(table, end="")


if __name__ == "__main__":
    main()
