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
import ast
import contextlib
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HEADER = re.compile(r"^# kernelbench: (level\d+/[^\s]+\.py)\s*$", re.M)
REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Entry:
    """One solution file and the KernelBench task it solves."""

    stem: str
    task_rel: str  # "level1/19_ReLU.py"
    solution_path: Path
    solution_src: str
    task_src: str = ""

    @property
    def level(self) -> int:
        return int(self.task_rel.split("/")[0].removeprefix("level"))

    @property
    def key(self) -> str:
        return self.task_rel.removesuffix(".py")


@dataclass
class Row:
    kernelrl: list[dict[str, Any]] = field(default_factory=list)
    kb_inproc: dict[str, Any] | None = None
    kb_subproc: dict[str, Any] | None = None


# ----------------------------------------------------------------------------- solutions
def task_rel_of(solution_src: str) -> str:
    """The ``levelN/<file>.py`` a solution names in its header comment."""
    match = HEADER.search(solution_src)
    if not match:
        raise ValueError("solution has no '# kernelbench: levelN/<task>.py' header")
    return match.group(1)


def solution_entries(
    solutions_dir: Path, kernelbench_dir: Path | None = None, only: set[str] | None = None
) -> list[Entry]:
    """Every solution of the folder, with its task source when ``kernelbench_dir`` is given.

    The header must name a task file with the solution's own stem: a mismatch is a mistake.
    """
    entries = []
    for path in sorted(solutions_dir.glob("*.py")):
        if path.name.startswith("_"):
            continue
        src = path.read_text()
        rel = task_rel_of(src)
        if Path(rel).stem != path.stem:
            raise ValueError(f"{path}: header names {rel}, not a task called {path.stem}")
        if only and path.stem not in only and rel.removesuffix(".py") not in only:
            continue
        entry = Entry(path.stem, rel, path, src)
        if kernelbench_dir is not None:
            entry.task_src = (kernelbench_dir / rel).read_text()
        entries.append(entry)
    return entries


# ----------------------------------------------------------------------------- kernelbench import
def load_kernelbench_eval(src_dir: Path) -> tuple[types.ModuleType, list[str]]:
    """KernelBench's ``eval`` module, imported from its source tree without its ``__init__``.

    Returns the module and the modules that were missing for ``kernelbench.utils`` (empty when
    the real one imported).
    """
    import importlib

    pkg_dir = src_dir / "kernelbench"
    if not (pkg_dir / "eval.py").is_file():
        raise FileNotFoundError(f"{pkg_dir / 'eval.py'} does not exist (give --kernelbench-src)")
    if "kernelbench" not in sys.modules:
        pkg = types.ModuleType("kernelbench")
        pkg.__path__ = [str(pkg_dir)]  # a package whose __init__ is not run
        pkg.__file__ = str(pkg_dir / "__init__.py")
        sys.modules["kernelbench"] = pkg
    missing: list[str] = []
    try:
        importlib.import_module("kernelbench.utils")
    except ImportError as exc:
        sys.modules.pop("kernelbench.utils", None)
        missing.append(exc.name or str(exc))
        sys.modules["kernelbench.utils"] = _utils_subset(pkg_dir / "utils.py", ["get_gpu_vendor"])
    return importlib.import_module("kernelbench.eval"), missing


def _utils_subset(utils_path: Path, names: list[str]) -> types.ModuleType:
    """A ``kernelbench.utils`` holding only the named functions, compiled from KernelBench's
    own ``utils.py`` (their code, not ours), with ``torch`` in scope as there."""
    import torch

    tree = ast.parse(utils_path.read_text())
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    found = {f.name for f in funcs}
    if found != set(names):
        raise ImportError(f"{utils_path} lacks {sorted(set(names) - found)}")
    module = types.ModuleType("kernelbench.utils")
    module.__file__ = str(utils_path)
    module.__dict__["torch"] = torch
    code = compile(ast.Module(body=funcs, type_ignores=[]), str(utils_path), "exec")
    exec(code, module.__dict__)  # noqa: S102 - KernelBench's own source
    return module


def kb_evaluate(kb_eval: types.ModuleType, entry: Entry, args: argparse.Namespace) -> dict:
    """One ``eval_kernel_against_ref`` call; its verdict, timings and speedup as plain data."""
    import torch

    started = time.perf_counter()
    out: dict[str, Any] = {"task": entry.key}
    try:
        res = kb_eval.eval_kernel_against_ref(
            entry.task_src,
            entry.solution_src,
            seed_num=42,
            num_correct_trials=args.kb_correct_trials,
            num_perf_trials=args.kb_perf_trials,
            measure_performance=True,
            timing_method="cuda_event",
            device=0,
            backend="triton",
            precision=torch.float32,
            check_for_excessive_speedup=True,  # also times the reference: gives ref_runtime
        )
    except Exception as exc:  # noqa: BLE001 - a crash of their harness is a result to report
        out.update(verdict="harness_exception", error=f"{type(exc).__name__}: {exc}"[:500])
    else:
        if res is None:
            out.update(verdict="retry (lock error)")
        else:
            if not res.compiled:
                verdict = "compile_error"
            elif res.correctness:
                verdict = "correct"
            elif "runtime_error" in res.metadata:
                verdict = "runtime_error"
            else:
                verdict = "incorrect"
            speedup = (
                res.ref_runtime / res.runtime if res.runtime > 0 and res.ref_runtime > 0 else None
            )
            meta = {k: str(v)[:300] for k, v in res.metadata.items()}
            out.update(
                verdict=verdict,
                runtime_ms=res.runtime,
                ref_runtime_ms=res.ref_runtime,
                speedup=speedup,
                metadata=meta,
            )
    out["seconds"] = time.perf_counter() - started
    out["oom"] = "out of memory" in json.dumps(out).lower()
    return out


def kb_runner_main(args: argparse.Namespace) -> None:
    """Child mode: evaluate the given stems with KernelBench in this process, one JSON line
    per evaluation on stdout (prefixed, so that what the solutions print is not mistaken)."""
    kb_eval, missing = load_kernelbench_eval(Path(args.kernelbench_src))
    entries = solution_entries(Path(args.solutions), Path(args.kernelbench), set(args.only))
    by_stem = {e.stem: e for e in entries}
    deadline = time.monotonic() + args.runner_budget_s
    for stem in args.only:
        if time.monotonic() > deadline:
            print("KBRESULT " + json.dumps({"task": by_stem[stem].key, "verdict": "skipped"}))
            continue
        result = kb_evaluate(kb_eval, by_stem[stem], args)
        result["missing_imports"] = missing
        print("KBRESULT " + json.dumps(result, default=str), flush=True)


def run_kb_phase(
    entries: list[Entry], args: argparse.Namespace, per_process: bool, budget_s: float
) -> tuple[dict[str, dict], float, int]:
    """KernelBench's harness over all entries: one child process for all (in-process mode,
    their way) or one child per evaluation. Returns results by stem, wall seconds, evaluations."""
    started = time.perf_counter()
    deadline = time.monotonic() + budget_s
    groups = [[e] for e in entries] if per_process else [entries]
    results: dict[str, dict] = {}
    for group in groups:
        left = deadline - time.monotonic()
        if left <= 5:
            for e in group:
                results[e.stem] = {"task": e.key, "verdict": "skipped (time budget)"}
            continue
        cmd = [
            sys.executable, str(Path(__file__).resolve()), "--kb-runner",
            "--kernelbench", args.kernelbench, "--kernelbench-src", args.kernelbench_src,
            "--solutions", args.solutions,
            "--kb-correct-trials", str(args.kb_correct_trials),
            "--kb-perf-trials", str(args.kb_perf_trials),
            "--runner-budget-s", str(max(left - 30, 1)),
            "--only", *[e.stem for e in group],
        ]  # fmt: skip
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=left + 60, cwd=tempfile.gettempdir()
            )
            stdout, stderr, rc = proc.stdout, proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
            stderr, rc = "timed out", None
        for line in stdout.splitlines():
            if line.startswith("KBRESULT "):
                data = json.loads(line.removeprefix("KBRESULT "))
                results[Path(data["task"]).name] = data
        for e in group:
            if e.stem not in results:
                tail = stderr.strip().splitlines()[-3:]
                results[e.stem] = {
                    "task": e.key,
                    "verdict": "process_died" if rc not in (0, None) else "no_result",
                    "error": f"rc={rc}: " + " | ".join(tail)[:500],
                    "oom": "out of memory" in stderr.lower(),
                }
    done = sum(1 for r in results.values() if not r["verdict"].startswith("skipped"))
    return results, time.perf_counter() - started, done


# ----------------------------------------------------------------------------- monitoring
class MemoryMonitor:
    """Peak GPU memory used on the device (NVML, sees every process) and peak RSS of this
    process's tree (trusted process plus sandboxes), sampled every ``interval_s``."""

    def __init__(self, interval_s: float = 0.2) -> None:
        self.interval_s = interval_s
        self.peak_gpu_bytes = 0
        self.peak_tree_rss_bytes = 0
        self.gpu_source = "none"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _gpu_reader(self):
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self.gpu_source = "nvml"
            return lambda: pynvml.nvmlDeviceGetMemoryInfo(handle).used
        except Exception:  # noqa: BLE001 - fall back to nvidia-smi
            pass

        def smi() -> int:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                capture_output=True, text=True, timeout=10,
            ).stdout  # fmt: skip
            return int(out.strip().splitlines()[0]) * 2**20

        self.gpu_source = "nvidia-smi"
        return smi

    def _run(self) -> None:
        try:
            import psutil
        except ImportError:
            psutil = None
        read_gpu = self._gpu_reader()
        me = psutil.Process() if psutil else None
        while not self._stop.is_set():
            with contextlib.suppress(Exception):  # a failed sample is skipped
                self.peak_gpu_bytes = max(self.peak_gpu_bytes, read_gpu())
            if me is not None:
                try:
                    procs = [me, *me.children(recursive=True)]
                    total = 0
                    for p in procs:
                        with contextlib.suppress(psutil.Error):  # exited meanwhile
                            total += p.memory_info().rss
                    self.peak_tree_rss_bytes = max(self.peak_tree_rss_bytes, total)
                except psutil.Error:
                    pass
            self._stop.wait(self.interval_s)

    def __enter__(self) -> MemoryMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


def peak_self_rss_bytes() -> int:
    """Peak RSS of this (trusted) process so far; Linux reports kilobytes."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ----------------------------------------------------------------------------- kernelrl phase
def ensure_kernelrl_importable() -> None:
    """The repository root is the package ``kernelrl``; on a machine where it is not installed,
    expose it under that name (sys.path also reaches the sandbox children via PYTHONPATH)."""
    try:
        import kernelrl.env.pools.local  # noqa: F401
    except ImportError:
        link_dir = Path(tempfile.mkdtemp(prefix="kernelrl_path_"))
        (link_dir / "kernelrl").symlink_to(REPO_ROOT, target_is_directory=True)
        sys.path.insert(0, str(link_dir))
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in [str(link_dir), os.environ.get("PYTHONPATH", "")] if p
        )
        for name in [m for m in sys.modules if m == "kernelrl" or m.startswith("kernelrl.")]:
            del sys.modules[name]
        import kernelrl.env.pools.local  # noqa: F401


def run_kernelrl_phase(
    entries: list[Entry], args: argparse.Namespace, budget_s: float
) -> tuple[dict[str, list[dict]], dict[str, Any]]:
    """Every solution ``repeats`` times through a LocalPool on the GPU."""
    ensure_kernelrl_importable()
    from kernelrl.env.evaluator import EvalConfig
    from kernelrl.env.pools.local import LocalPool
    from kernelrl.env.task import task_from_source

    heavy = [m for m in ("trl", "ray", "datasets", "vllm") if m in sys.modules]
    tasks = [task_from_source(e.task_src, e.key, "triton", e.level) for e in entries]
    started = time.perf_counter()
    config = EvalConfig(device="cuda", timeout_s=args.kernelrl_timeout_s)
    pool = LocalPool(config, per_gpu=args.per_gpu)
    ready = time.perf_counter()
    futures = []
    for _ in range(args.repeats):  # repeat r of every task before repeat r + 1
        futures.append(pool.submit(tasks, [e.solution_src for e in entries]))
    results: dict[str, list[dict]] = {e.stem: [] for e in entries}
    deadline = time.monotonic() + budget_s - (ready - started)
    finished = 0
    first_repeat_wall = None
    for batch in futures:
        for entry, fut in zip(entries, batch, strict=True):
            left = deadline - time.monotonic()
            try:
                res = fut.result(timeout=max(left, 0.1))
            except TimeoutError:
                results[entry.stem].append({"status": "skipped (time budget)"})
                continue
            except Exception as exc:  # noqa: BLE001 - a pool/evaluator crash is a result too
                results[entry.stem].append(
                    {"status": "pool_exception", "error": f"{type(exc).__name__}: {exc}"[:600]}
                )
                continue
            finished += 1
            d = res.to_dict()
            print(
                f"kernelrl {entry.key}: {d.get('status')} speedup {d.get('speedup_vs_eager')} "
                f"{(d.get('error') or '')[:200]!r}",
                flush=True,
            )
            results[entry.stem].append(
                {
                    "status": str(d.get("status")),
                    "speedup_vs_eager": d.get("speedup_vs_eager"),
                    "speedup_vs_compile": d.get("speedup_vs_compile"),
                    "checks_failed": d.get("checks_failed"),
                    "feedback": (d.get("feedback") or "")[:600],
                    "error": (d.get("error") or "")[:600],
                    "total_s": d.get("phase_seconds", {}).get("total"),
                    "phase_seconds": d.get("phase_seconds"),
                }
            )
        if first_repeat_wall is None:  # every task once, reference timings not yet cached
            first_repeat_wall = time.perf_counter() - ready
    wall = time.perf_counter() - ready
    timed_out = any(not f.done() for batch in futures for f in batch)
    if timed_out:
        for batch in futures:
            for f in batch:
                f.cancel()
    pool.close()
    stats = {
        "evaluations": finished,
        "startup_s": ready - started,
        "wall_s": wall,
        "evals_per_min": 60 * finished / wall if wall > 0 else None,
        "evals_per_min_first_repeat": (
            60 * len(entries) / first_repeat_wall
            if first_repeat_wall and all(r and "total_s" in r[0] for r in results.values())
            else None
        ),
        "evals_per_min_with_startup": 60 * finished / (wall + ready - started),
        "heavy_modules_imported": heavy,
    }
    return results, stats


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kernelbench", required=True, help="KernelBench task root (level1/ ...)")
    p.add_argument("--kernelbench-src", default=None, help="KernelBench src/ (default: DIR/../src)")
    p.add_argument("--solutions", default=str(REPO_ROOT / "benchmarks" / "kernelbench_solutions"))
    p.add_argument("--out", default="runs/kernelbench_harness")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--per-gpu", type=int, default=4, help="kernelrl evaluations in flight per GPU")
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
    args = p.parse_args(argv)
    args.kernelbench = str(Path(args.kernelbench).resolve())
    if args.kernelbench_src is None:
        args.kernelbench_src = str(Path(args.kernelbench).parent / "src")
    args.kernelbench_src = str(Path(args.kernelbench_src).resolve())
    args.solutions = str(Path(args.solutions).resolve())
    if args.kb_runner:
        kb_runner_main(args)
        return 0

    entries = solution_entries(Path(args.solutions), Path(args.kernelbench), set(args.only) or None)
    phases = args.phases.split(",")
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
        with MemoryMonitor() as mon:
            kr, stats = run_kernelrl_phase(entries, args, budget["kernelrl"])
        for stem, runs in kr.items():
            rows[stem].kernelrl = runs
        statuses = [r["status"] for runs in kr.values() for r in runs]
        totals.update(
            {
                "kernelrl evaluations": stats["evaluations"],
                "kernelrl evals/min (pool warm)": _fmt(stats["evals_per_min"], ".1f"),
                "kernelrl evals/min (first repeat)": _fmt(
                    stats["evals_per_min_first_repeat"], ".1f"
                ),
                "kernelrl evals/min (incl. pool start)": _fmt(
                    stats["evals_per_min_with_startup"], ".1f"
                ),
                "kernelrl all correct": bool(statuses) and all(s == "correct" for s in statuses),
                "kernelrl peak trusted RSS GiB": _fmt(peak_self_rss_bytes() / 2**30),
                "kernelrl peak RSS GiB, trusted + sandboxes": _fmt(mon.peak_tree_rss_bytes / 2**30),
                f"kernelrl peak GPU memory used GiB ({mon.gpu_source})": _fmt(
                    mon.peak_gpu_bytes / 2**30
                ),
                "kernelrl OOM": sum(
                    "out of memory" in json.dumps(r).lower() for runs in kr.values() for r in runs
                ),
                "kernelrl heavy modules imported (trl/ray/datasets/vllm)": stats[
                    "heavy_modules_imported"
                ],
            }
        )
        print(json.dumps(totals, indent=1), flush=True)
    kb_rates: dict[str, float | None] = {}
    write_results(out_dir, entries, rows, totals, kb_rates)

    for phase, per_process in (("kb-inproc", False), ("kb-subproc", True)):
        if phase not in phases:
            continue
        with MemoryMonitor() as mon:
            res, wall, done = run_kb_phase(entries, args, per_process, budget[phase])
        for stem, r in res.items():
            if stem in rows:
                if per_process:
                    rows[stem].kb_subproc = r
                else:
                    rows[stem].kb_inproc = r
        rate = 60 * done / wall if wall > 0 and done else None
        kb_rates[phase] = rate
        missing = sorted({m for r in res.values() for m in r.get("missing_imports", [])})
        totals.update(
            {
                f"{phase} evaluations": done,
                f"{phase} evals/min": _fmt(rate, ".1f"),
                f"{phase} all correct": all(r["verdict"] == "correct" for r in res.values()),
                f"{phase} OOM": sum(bool(r.get("oom")) for r in res.values()),
                f"{phase} peak GPU memory used GiB ({mon.gpu_source})": _fmt(
                    mon.peak_gpu_bytes / 2**30
                ),
                f"{phase} peak RSS GiB (its processes)": _fmt(mon.peak_tree_rss_bytes / 2**30),
                f"{phase} modules missing for kernelbench.utils": missing or "none",
            }
        )
        write_results(out_dir, entries, rows, totals, kb_rates)
    print(write_results(out_dir, entries, rows, totals, kb_rates), flush=True)
    return 0


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
