"""Every quiet-GPU wait of a KernelBench harness run, one JSON line each, and their summary.

Before a solution or a reference is timed, the worker probes until the GPU is found quiet
(``env/gpu_quiet.py``); a wait that times out leaves that evaluation's timing unused. The
harness's phase table gives only the waits' total seconds; this log gives each wait's probes:
how many launches came back late, how many reads were queued too late or slow, how many
probes spent time off the CPU, and whether and when the GPU was found quiet.

    python benchmarks/quiet_waits.py --log waits.jsonl -- --kernelbench KB/KernelBench \\
        --kernelbench-src KB/src --repeats 1 --phases kernelrl --shares kernelrl=1
    python benchmarks/quiet_waits.py --summarize waits.jsonl
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernelbench_harness  # noqa: E402
from kernelbench_kernelrl import ensure_kernelrl_importable  # noqa: E402

COUNTS = ("probes", "held_off_cpu", "late_launches", "queued_late", "slow_reads")


def log_every_wait(log: Path) -> None:
    """Wrap ``QuietProbe.wait`` in this process so that each wait appends its record."""
    ensure_kernelrl_importable()
    from kernelrl.env.gpu_quiet import QuietProbe

    wait = QuietProbe.wait
    started = time.perf_counter()

    @functools.wraps(wait)
    def logged(probe: QuietProbe, timeout_s: float) -> float | None:
        at = time.perf_counter() - started
        found = wait(probe, timeout_s)
        tally = probe.tally
        record: dict[str, Any] = {
            "at_s": round(at, 3),
            "timeout_s": timeout_s,
            "quiet_after_s": found,
            **{name: getattr(tally, name) for name in COUNTS},
            "launch_limit_us": probe.limit_s() * 1e6,
            "read_limit_us": probe.read_limit_s() * 1e6,
            "median_launch_us": _median_us(tally.launch_s),
            "median_read_us": _median_us(tally.read_s),
        }
        with log.open("a") as file:
            file.write(json.dumps(record) + "\n")
        return found

    QuietProbe.wait = logged


def summarize(log: Path) -> dict[str, Any]:
    """The waits' count, timeouts, seconds (a timeout counts its whole timeout) and probes."""
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    timeouts = [r for r in records if r["quiet_after_s"] is None]
    return {
        "waits": len(records),
        "timeouts": len(timeouts),
        "wait_s": round(sum(r["quiet_after_s"] or r["timeout_s"] for r in records), 3),
        **{name: sum(r[name] for r in records) for name in COUNTS},
    }


def _median_us(seconds: list[float]) -> float | None:
    return round(statistics.median(seconds) * 1e6, 1) if seconds else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--log", type=Path, help="run the harness, appending each wait here")
    which.add_argument("--summarize", type=Path, help="summarize a log written by --log")
    args, harness_args = parser.parse_known_args(argv)
    if args.summarize:
        if not args.summarize.is_file():
            parser.error(f"no wait log at {args.summarize}")
        print(json.dumps(summarize(args.summarize)))
        return 0
    log_every_wait(args.log)
    code = kernelbench_harness.main([a for a in harness_args if a != "--"])
    if args.log.is_file():
        print(json.dumps(summarize(args.log)))
    return code


if __name__ == "__main__":
    sys.exit(main())
