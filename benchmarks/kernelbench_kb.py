"""KernelBench's own harness, the other side of ``kernelbench_harness.py``: its ``eval`` module
imported without the package's LLM-client imports, one ``eval_kernel_against_ref`` call per
evaluation, run in child processes of ``kernelbench_harness.py --kb-runner``."""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernelbench_entries import Entry, solution_entries  # noqa: E402

# the script whose --kb-runner mode a KernelBench phase starts
HARNESS = Path(__file__).resolve().with_name("kernelbench_harness.py")


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


def import_error(src_dir: str) -> str | None:
    """Why KernelBench's harness does not import in a runner's interpreter (the last line of
    its error), or None. Asked before any phase runs: a package KernelBench's ``eval`` needs
    and this machine lacks (pydantic, requests) otherwise shows only after kernelrl's phase has
    spent its time, as every task's ``process_died``."""
    done = subprocess.run(
        [sys.executable, __file__, str(Path(src_dir).resolve())],
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),
    )
    if done.returncode == 0:
        return None
    lines = done.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit status {done.returncode}"


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
            sys.executable, str(HARNESS), "--kb-runner",
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


if __name__ == "__main__":  # python kernelbench_kb.py KB/src: exits 0 if KernelBench imports
    load_kernelbench_eval(Path(sys.argv[1]))
