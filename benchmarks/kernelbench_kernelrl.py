"""kernelrl's side of ``kernelbench_harness.py``: every solution through a ``LocalPool`` on the
GPU, and the memory the run takes (the trusted process, its sandboxes, the device)."""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernelbench_entries import Entry  # noqa: E402

if TYPE_CHECKING:
    from kernelrl.env.evaluator import EvalConfig

REPO_ROOT = Path(__file__).resolve().parent.parent


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
def result_row(d: dict[str, Any], shared: str) -> dict[str, Any]:
    """What the results keep of one evaluation (``EvalResult.to_dict``)."""
    sandbox = d.get("sandbox") or {}
    return {
        "status": str(d.get("status")),
        "speedup_vs_eager": d.get("speedup_vs_eager"),
        "speedup_vs_compile": d.get("speedup_vs_compile"),
        "checks_failed": d.get("checks_failed"),
        "feedback": (d.get("feedback") or "")[:600],
        "error": (d.get("error") or "")[:600],
        "total_s": d.get("phase_seconds", {}).get("total"),
        "phase_seconds": d.get("phase_seconds"),
        "output_ring": sandbox.get("output_ring"),
        "device_ring_refused": sandbox.get("device_ring_refused"),
        "gpu_memory_share": sandbox.get("gpu_memory_share"),
        "timing_shared": shared,
    }


def timing_shared(sandbox: dict[str, Any]) -> str:
    """Why a correct evaluation's timing went unused (the GPU shared, or nobody could tell)."""
    from kernelrl.env.gpu_claim import SHARED_WITH_KEY, SHARING_UNKNOWN_KEY

    if SHARED_WITH_KEY in sandbox:
        return f"shared with evaluators {sandbox[SHARED_WITH_KEY]}"
    return sandbox.get(SHARING_UNKNOWN_KEY, "")


def ensure_kernelrl_importable() -> None:
    """The repository root is the package ``kernelrl``; on a machine where it is not installed,
    expose it under that name (sys.path also reaches the sandbox children via PYTHONPATH)."""
    try:
        import kernelrl  # noqa: F401
    except ImportError:
        link_dir = Path(tempfile.mkdtemp(prefix="kernelrl_path_"))
        (link_dir / "kernelrl").symlink_to(REPO_ROOT, target_is_directory=True)
        sys.path.insert(0, str(link_dir))
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in [str(link_dir), os.environ.get("PYTHONPATH", "")] if p
        )
        for name in [m for m in sys.modules if m == "kernelrl" or m.startswith("kernelrl.")]:
            del sys.modules[name]
        import kernelrl  # noqa: F401


def kernelrl_config(args: argparse.Namespace) -> EvalConfig:
    """The evaluator's settings the harness's flags give (``evaluator_options``)."""
    from kernelrl.env.evaluator import EvalConfig

    return EvalConfig(
        device="cuda",
        timeout_s=args.kernelrl_timeout_s,
        timing=args.timing,
        compile_ahead=args.compile_ahead,
        admission_in_order=args.admission_in_order,
        admission_backfill=args.admission_backfill,
    )


def run_kernelrl_phase(
    entries: list[Entry], args: argparse.Namespace, budget_s: float
) -> tuple[dict[str, list[dict]], dict[str, Any]]:
    """Every solution ``repeats`` times through a LocalPool on the GPU; ``args`` as the
    harness's ``parse_args`` gives them, which made kernelrl importable."""
    from kernelrl.env.pools.local import LocalPool
    from kernelrl.env.task import task_from_source

    heavy = [m for m in ("trl", "ray", "datasets", "vllm") if m in sys.modules]
    tasks = [task_from_source(e.task_src, e.key, "triton", e.level) for e in entries]
    started = time.perf_counter()
    config = kernelrl_config(args)
    timing = config.timing
    pool = LocalPool(config, per_gpu=args.per_gpu, spares=args.spares)
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
            shared = timing_shared(d.get("sandbox") or {})
            print(
                f"kernelrl {entry.key}: {d.get('status')} speedup {d.get('speedup_vs_eager')} "
                f"{(d.get('error') or '')[:200]!r}{shared and ' timing unused: ' + shared}",
                flush=True,
            )
            results[entry.stem].append(result_row(d, shared))
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
        "enough_timed_ms": timing.enough_timed_ms,
        "move_local_memory": timing.move_local_memory,
        "spares": pool.sizing.spares,
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
