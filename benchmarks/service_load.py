"""Load test of the environment service: `kernelrl env serve` over HTTP on loopback.

Why: training, sweeps and curation of several users share one service, and none of its fault
tests said what load it holds or that nothing is lost under it. This script starts the real
service (its own local Ray, CPU workers under the Triton interpreter), drives it with many
concurrent HTTP clients and, on top of the well-formed traffic, with the clients a shared
service meets: bad requests (malformed JSON, a wrong schema, an oversized body, a body that
trickles in, a task that does not load, a solution that hangs), clients that disconnect before
their answer, a worker killed mid-run and the service process itself restarted mid-run.

It reports throughput and latency percentiles (p50/p95/p99) per evaluation and phase, the
memory of the service's processes over the run, and checks the requirements (``check``):

- every well-formed request is answered exactly once with a result for *its* task and
  solution, or gets a clear retryable error (503, connection refused/reset while the service
  restarts, a result marked ``sandbox["pool_error"]``), which the client retries;
- no (task, solution, device, versions) is recorded twice as a verdict in the results store;
- bad requests get their 4xx (or, for a hanging solution, the ``timeout`` verdict) within a
  bound;
- a disconnected client's queued work is cancelled, and once the clients stop nothing is left
  in flight in the service.

    python benchmarks/service_load.py --clients 64 --phase-s 60 --long-s 600 --out runs/load
    python benchmarks/service_load.py --help

``tests/benchmarks/test_service_load.py`` runs the same code at a small scale.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from service_load_clients import Load  # noqa: E402
from service_load_config import LoadConfig  # noqa: E402
from service_load_report import report  # noqa: E402
from service_load_service import Service  # noqa: E402

__all__ = ["LoadConfig", "main", "run_load"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, default in asdict(LoadConfig()).items():
        flag = "--" + name.replace("_", "-")
        if isinstance(default, bool):
            parser.add_argument(
                flag, type=lambda s: s.lower() in ("1", "true", "yes"), default=default
            )
        else:
            parser.add_argument(flag, type=type(default), default=default)
    config = LoadConfig(**vars(parser.parse_args(argv)))
    summary = run_load(config)
    print(json.dumps({k: v for k, v in summary.items() if k != "samples"}, indent=1, default=str))
    return 1 if summary["failures"] else 0


def run_load(config: LoadConfig) -> dict[str, Any]:
    """Start the service, run the load, stop it; the summary is also written to ``out``."""
    folder = Path(config.out).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    service = Service(config, folder)
    service.start_retrying()
    try:
        load = Load(config, service)
        asyncio.run(load.run())
    finally:
        service.stop(signal.SIGINT)
    summary = report(load)
    (folder / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


if __name__ == "__main__":
    sys.exit(main())
