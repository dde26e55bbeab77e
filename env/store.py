"""ResultsStore: every EvalResult, persisted in one embedded SQLite file.

Why SQLite: evaluations are expensive (seconds to minutes of GPU time) and many jobs want them
again: a repeated (task, solution, device) in RL, a resumed sweep, offline curation. SQLite in
WAL mode lets several processes on one node (Ray actors, a trainer, a sweep) read and write the
same file without a server; each result is committed as soon as it is written, so a run that is
killed and restarted finds every result that had finished. The same file holds the reference
timings (eager and torch.compile baselines), shared by all workers through
``reference_timings()``.

A verdict is served again only for exactly what decided it (``env/verdict_key.py``: the task's
source, tolerances and sizes, the backend, the solution, the device, the library versions, the
evaluation settings and the environment's own code). Rows written under an older key (schema
version 1, keyed on the task's source alone) stay readable but are never served.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from kernelrl.env.gpu_claim import SHARED_WITH_KEY, SHARING_UNKNOWN_KEY
from kernelrl.env.reference import ReferenceTimingCache
from kernelrl.env.result import POOL_ERROR_KEY, EvalResult, Status, TimingStats
from kernelrl.env.task import Task
from kernelrl.env.timing import TimingConfig
from kernelrl.env.verdict_key import VerdictContext, verdict_key

#: ``PRAGMA user_version`` of a store whose rows carry ``verdict_key``; older rows have none.
STORE_SCHEMA_VERSION = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT NOT NULL,
    task_hash TEXT NOT NULL,
    backend TEXT NOT NULL,
    solution_hash TEXT NOT NULL,
    solution TEXT NOT NULL,
    device TEXT NOT NULL,
    device_name TEXT NOT NULL,
    status TEXT NOT NULL,
    correct INTEGER NOT NULL,
    speedup_vs_eager REAL,
    speedup_vs_compile REAL,
    total_seconds REAL,
    versions TEXT NOT NULL,
    cacheable INTEGER NOT NULL,
    timestamp REAL NOT NULL,
    written REAL NOT NULL,
    result TEXT NOT NULL,
    verdict_key TEXT
);
CREATE INDEX IF NOT EXISTS results_key ON results (task_hash, solution_hash, device_name);
CREATE TABLE IF NOT EXISTS reference_timings (
    key TEXT PRIMARY KEY,
    stats TEXT,
    written REAL NOT NULL
);
"""


def solution_key(solution: str) -> str:
    """Full SHA-256 of the completion text: the cache key (EvalResult keeps a short one)."""
    return hashlib.sha256(solution.encode()).hexdigest()


def is_cacheable(result: EvalResult) -> bool:
    """A verdict about the solution, not about the infrastructure that evaluated it: neither a
    failure of the pool (``POOL_ERROR_KEY``) nor a ``harness_error`` (kernelrl's harness failed;
    served again, it would poison every rerun of that completion with our failure), nor a
    verdict timed beside another evaluator's work or where that could not be known
    (``gpu_shared_with``, ``gpu_sharing_unknown``: its timing unused, which a rerun on a GPU of
    its own would not repeat)."""
    return (
        result.scored
        and POOL_ERROR_KEY not in result.sandbox
        and SHARED_WITH_KEY not in result.sandbox
        and SHARING_UNKNOWN_KEY not in result.sandbox
    )


class ResultsStore:
    """Thread- and process-safe store of EvalResults and reference timings in one SQLite file.

    One connection per thread (sqlite3 connections are not shared across threads); WAL mode so
    readers never block the writer; a generous busy timeout so concurrent writers from several
    processes wait for each other instead of failing.
    """

    def __init__(self, path: str | Path, busy_timeout_s: float = 60.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.busy_timeout_s = busy_timeout_s
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        try:
            self._until_unlocked(lambda: self._conn().executescript(_SCHEMA))  # idempotent
            self._until_unlocked(self._upgrade)
        except sqlite3.DatabaseError as exc:
            self.close()
            if isinstance(exc, sqlite3.OperationalError) and _is_locked(exc):
                raise RuntimeError(
                    f"{self.path}: the results store stayed locked by another process for "
                    f"{self.busy_timeout_s:g} s"
                ) from exc
            raise ValueError(f"{self.path} is not a results store (SQLite): {exc}") from exc

    def _until_unlocked(self, step: Callable[[], Any]) -> Any:
        """Run ``step`` again while SQLite answers "database is locked", up to the busy timeout.

        SQLite's busy handler does not cover every lock: when two connections both want to
        upgrade at once (switching the file to WAL, creating the schema), one of them gets
        SQLITE_BUSY immediately rather than wait, to avoid a deadlock. Ray workers that open the
        same store as they start hit exactly that.
        """
        deadline = time.monotonic() + self.busy_timeout_s
        delay = 0.005
        while True:
            try:
                return step()
            except sqlite3.OperationalError as exc:
                if not _is_locked(exc) or time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)
            delay = min(2 * delay, 0.25)

    def _upgrade(self) -> None:
        """A store of schema 1 gets the ``verdict_key`` column; its rows keep none, so they are
        never served (they were keyed on the task's source alone). One writer at a time."""
        if self._conn().execute("PRAGMA user_version").fetchone()[0] >= STORE_SCHEMA_VERSION:
            return
        with self._write() as conn:
            columns = {row[1] for row in conn.execute("PRAGMA table_info(results)")}
            if "verdict_key" not in columns:
                conn.execute("ALTER TABLE results ADD COLUMN verdict_key TEXT")
            conn.execute("CREATE INDEX IF NOT EXISTS results_verdict ON results (verdict_key)")
            conn.execute(f"PRAGMA user_version = {STORE_SCHEMA_VERSION}")

    # ------------------------------------------------------------------ connections
    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            # check_same_thread=False only so that close() may close every thread's connection;
            # each connection is still used by the one thread that opened it.
            conn = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout_s,
                isolation_level=None,
                check_same_thread=False,
            )
            self._until_unlocked(lambda: conn.execute("PRAGMA journal_mode=WAL"))
            # NORMAL in WAL mode: a committed transaction survives the process being killed
            # (only a power loss can drop the last ones), at a fraction of FULL's fsync cost.
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_s * 1000)}")
            self._local.conn = conn
            with self._lock:
                self._connections.append(conn)
        return conn

    def _write(self) -> _Transaction:
        return _Transaction(self._conn())

    def close(self) -> None:
        with self._lock:
            connections, self._connections = self._connections, []
        for conn in connections:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
        self._local = threading.local()

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (to Ray actors): the path travels, the connections are reopened there."""
        return {"path": self.path, "busy_timeout_s": self.busy_timeout_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["busy_timeout_s"])

    # ------------------------------------------------------------------ results
    def put(self, task: Task, solution: str, result: EvalResult, context: VerdictContext) -> int:
        """Persist one result, judged in ``context``, committed before returning; returns its
        row id."""
        row = (
            task.id,
            task.hash,
            task.backend,
            solution_key(solution),
            solution,
            result.device,
            result.device_name,
            str(result.status),
            int(result.correct),
            result.speedup_vs_eager,
            result.speedup_vs_compile,
            result.phase_seconds.get("total"),
            json.dumps(result.versions, sort_keys=True),
            int(is_cacheable(result)),
            result.timestamp or time.time(),
            time.time(),
            result.to_json(),
            verdict_key(task, solution, context),
        )
        with self._write() as conn:
            cursor = conn.execute(
                "INSERT INTO results (task_id, task_hash, backend, solution_hash, solution, device,"
                " device_name, status, correct, speedup_vs_eager, speedup_vs_compile,"
                " total_seconds, versions, cacheable, timestamp, written, result, verdict_key)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                row,
            )
            return int(cursor.lastrowid)

    def get(self, task: Task, solution: str, context: VerdictContext) -> EvalResult | None:
        """The latest cacheable result judged exactly as ``task`` and ``solution`` would be in
        ``context`` (``verdict_key``), or None. Never a ``harness_error``, whatever the row's
        ``cacheable`` flag says."""
        row = (
            self._conn()
            .execute(
                "SELECT result FROM results WHERE verdict_key = ? AND cacheable = 1"
                " AND status != ? ORDER BY id DESC LIMIT 1",
                (verdict_key(task, solution, context), str(Status.HARNESS_ERROR)),
            )
            .fetchone()
        )
        return EvalResult.from_dict(json.loads(row[0])) if row is not None else None

    def count(self) -> int:
        return int(self._conn().execute("SELECT COUNT(*) FROM results").fetchone()[0])

    def rows(self) -> Iterator[dict[str, Any]]:
        """Every stored result as a flat record, oldest first."""
        cursor = self._conn().execute(
            "SELECT id, task_id, task_hash, backend, solution_hash, solution, device, device_name,"
            " status, correct, speedup_vs_eager, speedup_vs_compile, total_seconds, versions,"
            " cacheable, timestamp, result, verdict_key FROM results ORDER BY id"
        )
        names = [column[0] for column in cursor.description]
        for values in cursor:
            row = dict(zip(names, values, strict=True))
            row["correct"] = bool(row["correct"])
            row["cacheable"] = bool(row["cacheable"])
            yield row

    def results(self) -> Iterator[EvalResult]:
        for row in self.rows():
            yield EvalResult.from_dict(json.loads(row["result"]))

    def task_seconds(self, device_name: str | None = None) -> dict[str, float]:
        """Median evaluation wall time per task hash: the scheduler's cost estimate."""
        query = "SELECT task_hash, total_seconds FROM results WHERE total_seconds IS NOT NULL"
        args: tuple[Any, ...] = ()
        if device_name is not None:
            query += " AND device_name = ?"
            args = (device_name,)
        samples: dict[str, list[float]] = {}
        for task_hash, seconds in self._conn().execute(query, args):
            samples.setdefault(task_hash, []).append(seconds)
        return {key: statistics.median(values) for key, values in samples.items()}

    def to_dataset(self) -> Any:
        """All results as an HF ``datasets.Dataset`` (one row per evaluation).

        Flat columns for filtering (status, correct, speedups, ...); ``versions`` and the full
        EvalResult stay JSON strings (``result``) so the schema never depends on which optional
        fields a particular result filled.
        """
        from datasets import Dataset

        rows = list(self.rows())
        if not rows:
            return Dataset.from_dict({name: [] for name in _DATASET_COLUMNS})
        return Dataset.from_list(rows)

    # ------------------------------------------------------------------ reference timings
    def reference_timings(self) -> StoreTimingCache:
        """Adapter with ReferenceTimingCache's interface, backed by this store."""
        return StoreTimingCache(self)

    def get_timing(self, key: str) -> TimingStats | None | bool:
        row = (
            self._conn()
            .execute("SELECT stats FROM reference_timings WHERE key = ?", (key,))
            .fetchone()
        )
        if row is None:
            return False
        return TimingStats(**json.loads(row[0])) if row[0] is not None else None

    def timing_keys(self) -> list[str]:
        return [row[0] for row in self._conn().execute("SELECT key FROM reference_timings")]

    def put_timing(self, key: str, stats: TimingStats | None) -> None:
        value = json.dumps(stats.__dict__) if stats is not None else None
        with self._write() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO reference_timings (key, stats, written) VALUES (?, ?, ?)",
                (key, value, time.time()),
            )


_DATASET_COLUMNS = [
    "id",
    "task_id",
    "task_hash",
    "backend",
    "solution_hash",
    "solution",
    "device",
    "device_name",
    "status",
    "correct",
    "speedup_vs_eager",
    "speedup_vs_compile",
    "total_seconds",
    "versions",
    "cacheable",
    "timestamp",
    "result",
    "verdict_key",
]


class StoreTimingCache:
    """Reference timings in the store: what one worker measured, every worker reuses."""

    def __init__(self, store: ResultsStore) -> None:
        self.store = store

    @staticmethod
    def key(task: Task, device: torch.device, kind: str, timing: TimingConfig) -> str:
        return ReferenceTimingCache.key(task, device, kind, timing)

    def get(self, key: str) -> TimingStats | None | bool:
        """The cached stats, None for 'known to be unavailable', False for a miss."""
        return self.store.get_timing(key)

    def put(self, key: str, stats: TimingStats | None) -> None:
        self.store.put_timing(key, stats)


class _Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``: takes the write lock up front, so two writers never
    deadlock upgrading read locks, and the row is on disk when the block exits."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.conn.execute("COMMIT" if exc_type is None else "ROLLBACK")


def _is_locked(exc: sqlite3.OperationalError) -> bool:
    return "locked" in str(exc) or "busy" in str(exc)
