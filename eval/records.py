"""One sample of a sweep, and the JSONL file that stores all of them.

``samples.jsonl`` is the sweep's store: one line per (task, sample, turn), appended and fsynced
as soon as its evaluation finishes (turns count from 1 there, as in reports; in memory
``SampleRecord.turn`` counts from 0). A sweep that is killed restarts by reading it back and
skipping every key already there; a torn last line (the process died mid-write) is ignored and
rewritten. Reports are computed from this file alone, so they can be rebuilt at any time.
"""

from __future__ import annotations

import errno
import json
import os
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kernelrl.env.result import EvalResult

Key = tuple[str, int, int]  # (task_id, sample, turn)

SAMPLES_FILE = "samples.jsonl"  # the store
CONFIG_FILE = "config.json"  # the settings the samples were made with
TASKS_FILE = "tasks.json"  # the selected tasks, with why a task got no attempt
NO_SOLUTION = "no solution"  # the reason of a task that the fixed client has nothing for


@dataclass
class SelectedTask:
    """One task the sweep selected. Every rate's denominator counts it, attempts or not.

    ``samples`` is how many samples were planned (0: the fixed client had none); ``reason`` says
    why the sweep produced no evaluated attempt for it (``no solution``, ``not evaluated: ...``),
    empty when nothing went wrong on the sweep's side.
    """

    task_id: str
    level: int | None = None
    category: str = "uncategorized"
    samples: int = 1
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SelectedTask:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


def _write(fd: int, data: bytes) -> int:
    """One ``write(2)``: the single place results reach the disk (tests inject ENOSPC here)."""
    return os.write(fd, data)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[_write(fd, view) :]


def write_fix(error: OSError, folder: str | Path) -> str:
    """What to do about a results file that could not be written. Only a full disk or quota is
    fixed by freeing space; telling someone to free space for a read-only folder sends them the
    wrong way."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free some space"
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"make {folder} writable"
    return f"fix what stops writes to {folder}"


def write_atomic(path: str | Path, text: str) -> None:
    """Replace ``path`` with ``text`` all at once: a reader (or a full disk) sees the old file or
    the new one, never an empty or half-written one. The scratch file is removed on failure."""
    path = Path(path)
    scratch = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, text.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(scratch, path)
    except OSError as exc:
        scratch.unlink(missing_ok=True)
        if exc.filename is None:  # a failed write(2) names no file: say which one it was
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    except BaseException:
        scratch.unlink(missing_ok=True)
        raise


def write_tasks(path: str | Path, tasks: list[SelectedTask]) -> None:
    """Write ``tasks.json`` atomically (a report read mid-write sees the old or the new file)."""
    write_atomic(path, json.dumps([t.to_dict() for t in tasks], indent=1) + "\n")


def read_tasks(path: str | Path) -> list[SelectedTask] | None:
    """The selection of a results folder's ``tasks.json``; None for folders written before it."""
    path = Path(path)
    if not path.exists():
        return None
    return [SelectedTask.from_dict(row) for row in json.loads(path.read_text())]


@dataclass
class SampleRecord:
    task_id: str
    sample: int
    turn: int
    result: EvalResult
    completion: str = ""
    level: int | None = None
    category: str = ""
    finish_reason: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    generation_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> Key:
        return (self.task_id, self.sample, self.turn)

    def to_dict(self) -> dict[str, Any]:
        """As stored: ``turn`` counts from 1, as reports do (``turn_base: 1`` says so; records
        without it were written counting from 0, and are read as such)."""
        data = asdict(self)
        data["result"] = self.result.to_dict()
        data["turn"] = self.turn + 1
        data["turn_base"] = 1
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SampleRecord:
        data = dict(data)
        data["result"] = EvalResult.from_dict(data["result"])
        data["turn"] = int(data["turn"]) - int(data.get("turn_base", 0))
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


def read_records(path: str | Path) -> list[SampleRecord]:
    """Every complete record of a samples file; a later duplicate key replaces an earlier one."""
    path = Path(path)
    if not path.exists():
        return []
    records: dict[Key, SampleRecord] = {}
    with path.open() as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = SampleRecord.from_dict(json.loads(line))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                if not line.endswith("\n"):
                    break  # torn last line of a killed run
                raise ValueError(f"{path}:{number}: not a sample record ({exc})") from exc
            records[record.key] = record
    return list(records.values())


class SamplesFile:
    """Append-only JSONL store of SampleRecords, safe to write from pool callback threads."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._truncate_torn_tail()

    def _truncate_torn_tail(self) -> None:
        """Cut a partial last line (no newline) so the next append starts on a fresh line."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            with self.path.open("r+b") as handle:
                handle.truncate(cut)

    def load(self) -> dict[Key, SampleRecord]:
        return {record.key: record for record in read_records(self.path)}

    def append(self, record: SampleRecord) -> None:
        """Append one line and fsync it. On a write error (a full disk) the file is cut back to
        its last complete line and the ``OSError`` propagates: nothing half-written stays."""
        line = (json.dumps(record.to_dict(), sort_keys=True) + "\n").encode()
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                size = os.fstat(fd).st_size
                try:
                    _write_all(fd, line)
                    os.fsync(fd)
                except OSError:
                    os.ftruncate(fd, size)  # needs no free space
                    raise
            finally:
                os.close(fd)
