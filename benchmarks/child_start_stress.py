"""Start, take and close sandbox children from several threads at once, as a busy pool does,
and say how many failed and why: a quick check of the fork server on a new host.

    python benchmarks/child_start_stress.py --device cuda --spare 16 --threads 8 --per-thread 6
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from kernelrl.env.sandbox.processes import ChildPool


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--spare", type=int, default=6)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--per-thread", type=int, default=6)
    args = parser.parse_args()
    pool = ChildPool(args.device, 0 if args.device != "cpu" else None, spare=args.spare)
    errors: list[str] = []
    ready: list[dict] = []

    def take() -> None:
        for _ in range(args.per_thread):
            try:
                child = pool.acquire()
                taken = time.monotonic()
                ready.append({**child.ready_info, "spawn_to_taken_seconds": taken - child.started})
                child.close()
            except Exception as exc:  # noqa: BLE001 - counted and shown
                errors.append(str(exc)[-1500:])

    start = time.perf_counter()
    threads = [threading.Thread(target=take) for _ in range(args.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    pool.close()
    print(
        f"{len(ready)} children ready, {len(errors)} failed, in {wall:.1f} s "
        f"({len(ready) / wall:.2f} ready children/s, {args.spare} spares)"
    )
    keys = (
        "spawn_to_taken_seconds",
        "import_seconds",
        "gate_seconds",
        "cuda_init_seconds",
        "profiler_init_seconds",
        "audit_init_seconds",
        "cpu_seconds",
    )
    for key in keys:
        values = [info[key] for info in ready if key in info]
        if values:
            print(f"  {key}: median {statistics.median(values):.3f} s, max {max(values):.3f} s")
    for error in errors[:3]:
        print("---\n" + error)
    raise SystemExit(1 if errors else 0)


if __name__ == "__main__":
    main()
