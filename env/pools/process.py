"""ProcessPool: a LocalPool in a process of its own (``env_pool: process``).

LocalPool's slots are threads of the process that owns the pool, so the trusted side of every
evaluation (the sandbox's supervision, the reference, the output comparison) runs under that
process's interpreter lock. A trainer that generates while evaluations run
(``async_generation``) shares that lock with every busy slot: on one H200, generating a batch
took twice as long beside eight slots on the host's cores as alone (benchmarks/README.md,
"Asynchronous RL"). ProcessPool starts the same LocalPool in a spawned process and speaks to it
over a pipe; the caller's process keeps only futures and one thread that settles them.

What the caller sees is LocalPool's contract: one future per item, the batch deadline and
backpressure (the pool process stops reading the pipe while its queue is full). The pool
process holds trusted state only; solutions still run in its sandboxed children. If it dies,
what it had not answered becomes a ``harness_error`` (ours, never the kernel's fault; no
reward) and later submissions raise.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing as mp
import signal
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import Any

from kernelrl.env.pools.base import SubmitPool, check_batch, settle
from kernelrl.env.pools.sizing import AUTO, check_per_gpu
from kernelrl.env.pools.verdicts import pool_result
from kernelrl.env.result import EvalResult, Status
from kernelrl.env.task import Task

log = logging.getLogger(__name__)

START_TIMEOUT_S = 600.0  # the pool process imports torch and warms its sandbox children


class ProcessPool(SubmitPool):
    """See the module docstring. Arguments as ``LocalPool``'s."""

    def __init__(self, config: Any = None, **local_pool_kwargs: Any) -> None:
        check_per_gpu(local_pool_kwargs.get("per_gpu", AUTO))  # here, not in the pool process
        context = mp.get_context("spawn")  # never fork a process that may hold CUDA or threads
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=serve, args=(child, config, local_pool_kwargs), name="kernelrl-env-pool"
        )
        self._process.start()
        child.close()
        if not self._conn.poll(START_TIMEOUT_S):
            self._process.kill()
            raise RuntimeError(f"the environment pool process did not start in {START_TIMEOUT_S} s")
        try:
            kind, payload = self._conn.recv()
        except EOFError:
            self._process.join()
            raise RuntimeError(
                f"the environment pool process exited before it started (code "
                f"{self._process.exitcode}); it is spawned, so it imports the main module: run "
                f"from a file or module whose entry is under `if __name__ == '__main__':`"
            ) from None
        if kind == "failed":
            self._process.join()
            raise RuntimeError(f"the environment pool process could not start: {payload}")
        self.device, self.device_name, self.versions, self._slots, self.sizing = payload
        self._send_lock = threading.Lock()
        self._pending: dict[int, tuple[Future, Task, str]] = {}
        self._pending_lock = threading.Lock()
        self._ids = itertools.count()
        self._closed = False
        self._gone: str | None = None  # why the pool process is no longer there
        self._reader = threading.Thread(target=self._read, name="kernelrl-env-pool", daemon=True)
        self._reader.start()

    @property
    def num_slots(self) -> int:
        return self._slots

    def submit(
        self, tasks: Sequence[Task], solutions: Sequence[str], timeout_s: float | None = None
    ) -> list[Future[EvalResult]]:
        """One future per item, in input order; blocks while the pool process's queue is full."""
        if self._closed:
            raise RuntimeError("pool is closed")
        if self._gone is not None:
            raise RuntimeError(self._gone)
        check_batch(tasks, solutions)
        items = []
        with self._pending_lock:
            for task, solution in zip(tasks, solutions, strict=True):
                key = next(self._ids)
                self._pending[key] = (Future(), task, solution)
                items.append((key, task, solution))
        futures = [self._pending[key][0] for key, _, _ in items]
        try:
            with self._send_lock:
                self._conn.send(("submit", items, timeout_s))
        except (OSError, EOFError) as exc:
            self._lost(f"the environment pool process is gone ({type(exc).__name__})")
        return futures

    def close(self) -> None:
        """Finish what was submitted, then stop the pool process and its children."""
        if self._closed:
            return
        self._closed = True
        with self._send_lock, contextlib.suppress(OSError, EOFError):
            self._conn.send(("close", None, None))
        self._reader.join()
        self._process.join()
        self._conn.close()

    def _read(self) -> None:
        """Settle each future as its verdict comes back, until the pool process ends."""
        while True:
            try:
                kind, key, payload = self._conn.recv()
            except (EOFError, OSError):
                break
            if kind == "closed":
                break
            with self._pending_lock:
                entry = self._pending.pop(key, None)
            if entry is None:
                continue
            if kind == "result":
                settle(entry[0], payload)
            else:
                settle(entry[0], error=payload)
        self._process.join(timeout=30)
        code = self._process.exitcode
        if not self._closed or code not in (0, None):
            self._lost(f"the environment pool process exited (code {code})")

    def _lost(self, why: str) -> None:
        """Answer everything unanswered as our own failure, and refuse what comes later."""
        self._gone = why
        with self._pending_lock:
            pending, self._pending = self._pending, {}
        where = (self.device, self.device_name, self.versions)
        for future, task, solution in pending.values():
            settle(
                future,
                pool_result(task, solution, where, Status.HARNESS_ERROR, why, "pool_process"),
            )
        if pending:
            log.error("%s: %d evaluations answered as harness_error", why, len(pending))


# ------------------------------------------------------------------ in the pool process
def serve(conn: Connection, config: Any, local_pool_kwargs: dict[str, Any]) -> None:
    """The pool process: a LocalPool fed from the pipe, each verdict sent back as it comes."""
    from kernelrl.env.pools.local import LocalPool

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller's Ctrl-C reaches it as a close
    try:
        pool = LocalPool(config, **local_pool_kwargs)
    except BaseException as exc:
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    sizing = pool.sizing
    conn.send(("ready", (pool.device, pool.device_name, pool.versions, pool.num_slots, sizing)))
    send_lock = threading.Lock()

    def answer(key: int, future: Future) -> None:
        error = future.exception()
        message = ("result", key, future.result()) if error is None else ("error", key, error)
        with send_lock:
            try:
                conn.send(message)
            except (OSError, EOFError):
                pass  # the caller is gone; close() below ends the pool
            except Exception as exc:  # an exception that does not pickle: say what it was
                conn.send(("error", key, RuntimeError(f"{type(error).__name__}: {error}")))
                log.debug("unpicklable answer: %s", exc)

    while True:
        try:
            kind, items, timeout_s = conn.recv()
        except (EOFError, OSError):
            break  # the caller died: finish nothing more than what is queued
        if kind == "close":
            break
        tasks = [task for _, task, _ in items]
        futures = pool.submit(tasks, [solution for _, _, solution in items], timeout_s)
        for (key, _, _), future in zip(items, futures, strict=True):
            future.add_done_callback(lambda f, key=key: answer(key, f))
    pool.close()
    with send_lock, contextlib.suppress(OSError, EOFError):
        conn.send(("closed", None, None))
