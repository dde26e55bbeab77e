"""kernelrl's environment and KernelBench's own harness, side by side, on real KernelBench tasks.

Why: until now kernelrl was measured on its 31 small bundled tasks only. This evaluates our own
legitimate Triton solutions (``benchmarks/kernelbench_solutions/``, each naming its task in a
``# kernelbench: levelN/<file>.py`` header) at KernelBench's published sizes, in one run:

(a) kernelrl: ``LocalPool(EvalConfig(device="cuda"))``, every solution ``--repeats`` times
    (verdicts, median speedup vs eager and its spread max/min, evaluations per minute, peak RSS
    of this trusted process, peak GPU memory used on the device, sampled through NVML);
(b) KernelBench's ``eval_kernel_against_ref`` (backend="triton"), once with all solutions in one
    process (as their scripts do) and once in a fresh process per evaluation.

GPU only. It writes ``results.md`` (the table printed at the end) and ``results.json`` to
``--out``. A ``--time-budget-s`` is split between the three phases; work left over when a phase's
share is spent is reported as skipped, never silently dropped.

    python benchmarks/kernelbench_harness.py --kernelbench /path/KernelBench \
        --kernelbench-src /path/KernelBench-repo/src --solutions benchmarks/kernelbench_solutions \
        --out runs/kernelbench_harness --repeats 3 --time-budget-s 450

KernelBench's package ``__init__`` imports ``utils``, which imports openai/litellm/dotenv (LLM
clients). They are not needed to evaluate, so the package is registered without running its
``__init__``; ``eval.py`` imports ``kernelbench.utils`` for ``get_gpu_vendor`` only: when the
real ``utils`` cannot be imported, that one function is taken from KernelBench's own
``utils.py`` source (not rewritten) and the missing modules are reported. ``eval.py`` itself
needs pydantic, requests and numpy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernelbench_entries import Entry, Row, solution_entries  # noqa: E402
from kernelbench_kb import import_error, kb_runner_main, run_kb_phase  # noqa: E402
from kernelbench_kernelrl import (  # noqa: E402
    REPO_ROOT,
    MemoryMonitor,
    ensure_kernelrl_importable,
    peak_self_rss_bytes,
    run_kernelrl_phase,
)

__all__ = ["main", "solution_entries"]


# ----------------------------------------------------------------------------- report
def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def summarise_kernelrl(runs: list[dict]) -> dict[str, Any]:
    statuses = [r["status"] for r in runs]
    speedups = [r["speedup_vs_eager"] for r in runs if r.get("speedup_vs_eager")]
    verdict = statuses[0] if len(set(statuses)) == 1 else "/".join(statuses) if statuses else "-"
    return {
        "verdict": verdict,
        "median_speedup": statistics.median(speedups) if speedups else None,
        "spread": max(speedups) / min(speedups) if len(speedups) > 1 else None,
    }


def markdown_report(entries: list[Entry], rows: dict[str, Row], totals: dict[str, Any]) -> str:
    lines = [
        "| task | kernelrl verdict (x repeats) | kernelrl speedup (median) | spread max/min | "
        "KB in-process verdict | KB in-process speedup | KB per-process verdict | "
        "KB per-process speedup |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for e in entries:
        row = rows[e.stem]
        k = summarise_kernelrl(row.kernelrl)
        a = row.kb_inproc or {}
        b = row.kb_subproc or {}
        lines.append(
            f"| {e.key} | {k['verdict']} (x{len(row.kernelrl)}) | {_fmt(k['median_speedup'])} | "
            f"{_fmt(k['spread'], '.3f')} | {a.get('verdict', '-')} | {_fmt(a.get('speedup'))} | "
            f"{b.get('verdict', '-')} | {_fmt(b.get('speedup'))} |"
        )
    lines.append("")
    lines += [f"- {k}: {v}" for k, v in totals.items()]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kernelbench", required=True, help="KernelBench task root (level1/ ...)")
    p.add_argument("--kernelbench-src", default=None, help="KernelBench src/ (default: DIR/../src)")
    p.add_argument("--solutions", default=str(REPO_ROOT / "benchmarks" / "kernelbench_solutions"))
    p.add_argument("--out", default="runs/kernelbench_harness")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--per-gpu", type=int, default=4, help="kernelrl evaluations in flight per GPU")
    p.add_argument(
        "--spares",
        type=int,
        default=None,
        help="kernelrl sandboxes kept warming per GPU (default: sized from the slots)",
    )
    p.add_argument("--kernelrl-timeout-s", type=float, default=180.0)
    p.add_argument("--kb-correct-trials", type=int, default=3)
    p.add_argument("--kb-perf-trials", type=int, default=20)
    p.add_argument("--time-budget-s", type=float, default=450.0, help="for all three phases")
    p.add_argument("--phases", default="kernelrl,kb-inproc,kb-subproc")
    p.add_argument(
        "--shares",
        default="kernelrl=0.5,kb-inproc=0.25,kb-subproc=0.25",
        help="how the time budget is split between the phases",
    )
    p.add_argument("--only", nargs="*", default=[], help="solution stems or levelN/stem")
    p.add_argument("--kb-runner", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--runner-budget-s", type=float, default=1e9, help=argparse.SUPPRESS)
    ensure_kernelrl_importable()  # the evaluator's options are kernelrl's own
    from evaluator_options import add_evaluator_args, timing_from_args

    add_evaluator_args(p)
    args = p.parse_args(argv)
    args.timing = timing_from_args(p, args)
    args.kernelbench = str(Path(args.kernelbench).resolve())
    if args.kernelbench_src is None:
        args.kernelbench_src = str(Path(args.kernelbench).parent / "src")
    args.kernelbench_src = str(Path(args.kernelbench_src).resolve())
    args.solutions = str(Path(args.solutions).resolve())
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.kb_runner:
        kb_runner_main(args)
        return 0
    phases = args.phases.split(",")
    if any(phase.startswith("kb-") for phase in phases):
        why = import_error(args.kernelbench_src)
        if why is not None:
            raise SystemExit(
                f"KernelBench's harness does not import here ({why}): install what it names, "
                "or leave kb-inproc and kb-subproc out of --phases"
            )
    entries = solution_entries(Path(args.solutions), Path(args.kernelbench), set(args.only) or None)
    # by default kernelrl gets half the budget (it runs every solution `repeats` times),
    # KernelBench's two modes a quarter each
    shares = {k: float(v) for k, v in (item.split("=") for item in args.shares.split(","))}
    norm = sum(shares[ph] for ph in phases)
    budget = {ph: args.time_budget_s * shares[ph] / norm for ph in phases}
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("KERNELRL_CACHE", str(out_dir.resolve() / "kernelrl-cache"))
    rows = {e.stem: Row() for e in entries}
    totals: dict[str, Any] = {"tasks": len(entries)}
    print(f"{len(entries)} solutions; budgets {budget}", flush=True)
    if "kernelrl" in phases:
        totals.update(kernelrl_phase(entries, args, budget["kernelrl"], rows))
        print(json.dumps(totals, indent=1), flush=True)
    kb_rates: dict[str, float | None] = {}
    write_results(out_dir, entries, rows, totals, kb_rates)
    for phase, per_process in (("kb-inproc", False), ("kb-subproc", True)):
        if phase not in phases:
            continue
        totals.update(kb_phase(entries, args, phase, per_process, budget[phase], rows, kb_rates))
        write_results(out_dir, entries, rows, totals, kb_rates)
    print(write_results(out_dir, entries, rows, totals, kb_rates), flush=True)
    return 0


def kernelrl_phase(
    entries: list[Entry], args: argparse.Namespace, budget_s: float, rows: dict[str, Row]
) -> dict[str, Any]:
    """kernelrl's phase, its results filed in ``rows``; returns its totals."""
    with MemoryMonitor() as mon:
        kr, stats = run_kernelrl_phase(entries, args, budget_s)
    for stem, runs in kr.items():
        rows[stem].kernelrl = runs
    statuses = [r["status"] for runs in kr.values() for r in runs]
    return {
        "kernelrl options": (
            f"enough_timed_ms={stats['enough_timed_ms']}, "
            f"move_local_memory={stats['move_local_memory']}, "
            f"compile_ahead={args.compile_ahead}, per_gpu={args.per_gpu}, "
            f"spares={stats['spares']}, admission_in_order={args.admission_in_order}, "
            f"admission_backfill={args.admission_backfill}"
        ),
        "kernelrl evaluations": stats["evaluations"],
        "kernelrl evals/min (pool warm)": _fmt(stats["evals_per_min"], ".1f"),
        "kernelrl evals/min (first repeat)": _fmt(stats["evals_per_min_first_repeat"], ".1f"),
        "kernelrl evals/min (incl. pool start)": _fmt(stats["evals_per_min_with_startup"], ".1f"),
        **verdict_totals("kernelrl", statuses),
        "kernelrl output rings": dict(
            Counter(str(r.get("output_ring")) for runs in kr.values() for r in runs)
        ),
        "kernelrl peak trusted RSS GiB": _fmt(peak_self_rss_bytes() / 2**30),
        "kernelrl peak RSS GiB, trusted + sandboxes": _fmt(mon.peak_tree_rss_bytes / 2**30),
        f"kernelrl peak GPU memory used GiB ({mon.gpu_source})": _fmt(mon.peak_gpu_bytes / 2**30),
        "kernelrl OOM": sum(
            "out of memory" in json.dumps(r).lower() for runs in kr.values() for r in runs
        ),
        "kernelrl heavy modules imported (trl/ray/datasets/vllm)": stats["heavy_modules_imported"],
        "kernelrl phase sums s (every evaluation)": phase_sums(kr),
    }


def phase_sums(runs_by_task: dict[str, list[dict[str, Any]]]) -> dict[str, float]:
    """Each phase's seconds summed over every evaluation, largest first: where the set's time
    went (phases overlap across evaluations in flight, and some nest in others)."""
    sums: Counter[str] = Counter()
    for runs in runs_by_task.values():
        for run in runs:
            sums.update(run.get("phase_seconds") or {})
    return {name: round(seconds, 1) for name, seconds in sums.most_common()}


def kb_phase(
    entries: list[Entry],
    args: argparse.Namespace,
    phase: str,
    per_process: bool,
    budget_s: float,
    rows: dict[str, Row],
    kb_rates: dict[str, float | None],
) -> dict[str, Any]:
    """One of KernelBench's two phases, its results filed in ``rows`` and its rate in
    ``kb_rates``; returns its totals."""
    with MemoryMonitor() as mon:
        res, wall, done = run_kb_phase(entries, args, per_process, budget_s)
    for stem, r in res.items():
        if stem in rows:
            if per_process:
                rows[stem].kb_subproc = r
            else:
                rows[stem].kb_inproc = r
    rate = 60 * done / wall if wall > 0 and done else None
    kb_rates[phase] = rate
    missing = sorted({m for r in res.values() for m in r.get("missing_imports", [])})
    return {
        f"{phase} evaluations": done,
        f"{phase} evals/min": _fmt(rate, ".1f"),
        **verdict_totals(phase, [r["verdict"] for r in res.values()]),
        f"{phase} OOM": sum(bool(r.get("oom")) for r in res.values()),
        f"{phase} peak GPU memory used GiB ({mon.gpu_source})": _fmt(mon.peak_gpu_bytes / 2**30),
        f"{phase} peak RSS GiB (its processes)": _fmt(mon.peak_tree_rss_bytes / 2**30),
        f"{phase} modules missing for kernelbench.utils": missing or "none",
    }


def verdict_totals(phase: str, verdicts: list[str]) -> dict[str, Any]:
    """Whether every task a phase evaluated was judged correct, and how many its budget left
    unevaluated: a task skipped for time is neither correct nor a failure of the solution."""
    evaluated = [v for v in verdicts if not v.startswith("skipped")]
    return {
        f"{phase} all evaluated correct": bool(evaluated)
        and all(v == "correct" for v in evaluated),
        f"{phase} skipped (time budget)": len(verdicts) - len(evaluated),
    }


def write_results(
    out_dir: Path,
    entries: list[Entry],
    rows: dict[str, Row],
    totals: dict[str, Any],
    kb_rates: dict[str, float | None],
) -> str:
    """results.md and results.json as they stand: written after every phase, so that a run cut
    short keeps what finished."""
    for mode, name in (("kb-inproc", "in-process"), ("kb-subproc", "per-process")):
        for kr_key, label in (
            ("kernelrl evals/min (first repeat)", "first repeat"),
            ("kernelrl evals/min (pool warm)", "all repeats"),
        ):
            kr_rate = totals.get(kr_key)
            if kr_rate not in (None, "-") and kb_rates.get(mode):
                totals[f"ratio kernelrl ({label}) / KB {name} evals/min"] = _fmt(
                    float(kr_rate) / kb_rates[mode]
                )
    report = markdown_report(entries, rows, totals)
    (out_dir / "results.md").write_text(report)
    raw = {e.stem: {"task": e.key, **vars(rows[e.stem])} for e in entries}
    (out_dir / "results.json").write_text(
        json.dumps({"totals": totals, "rows": raw}, indent=1, default=str)
    )
    return report


if __name__ == "__main__":
    sys.exit(main())
