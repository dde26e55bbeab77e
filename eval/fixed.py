"""Fixed solutions: a "client" that replays given completions instead of sampling a model.

Why: a sweep over known solutions (reference solutions, a previous model's outputs, solutions
written to be wrong) checks the whole evaluation and reporting path with answers known in
advance, and scores completions produced elsewhere with exactly the same metrics.

Sources, each adding samples to the tasks it covers (sample numbers continue across sources):

- a folder: a file whose path relative to the folder, without its suffix, is a task id
  (``01_relu.py``, ``level1/1_Square_matrix_multiplication_.py``) is one sample of that task;
  ``<task id>__<label>.py`` and ``<task id>/<anything>.py`` add more samples, in name order;
- a JSONL file: rows ``{"task_id", "completion"}`` with optional ``"sample"`` and ``"turn"``
  (default: the next sample of the task, turn 0). Rows for later turns replay refinement.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from kernelrl.eval.clients import Generation, Request

SOLUTION_SUFFIXES = {".py", ".txt", ".md", ".cu"}


class FixedSolutions:
    name = "fixed"

    def __init__(self, sources: Sequence[str | Path], task_ids: Iterable[str]) -> None:
        self.task_ids = set(task_ids)
        self.completions: dict[tuple[str, int, int], str] = {}
        self.origins: dict[tuple[str, int, int], str] = {}
        self.unmatched: list[str] = []
        for source in sources:
            self._add_source(Path(source))

    # ------------------------------------------------------------------ loading
    def _add_source(self, path: Path) -> None:
        if path.is_dir():
            found = self._read_folder(path)
        elif path.is_file():
            found = self._read_jsonl(path)
        else:
            raise ValueError(f"fixed solutions: {path} is neither a folder nor a JSONL file")
        offset = {task: self.samples_for(task) for task in {t for t, _, _ in found}}
        for (task, sample, turn), (text, origin) in found.items():
            key = (task, offset[task] + sample, turn)
            self.completions[key] = text
            self.origins[key] = origin

    def _task_of(self, relative: Path) -> str | None:
        stem = relative.with_suffix("").as_posix()
        if stem in self.task_ids:
            return stem
        if "__" in relative.name:
            prefix = (relative.parent / relative.name.split("__", 1)[0]).as_posix()
            if prefix.startswith("./"):
                prefix = prefix[2:]
            if prefix in self.task_ids:
                return prefix
        parent = relative.parent.as_posix()
        return parent if parent in self.task_ids else None

    def _read_folder(self, folder: Path) -> dict[tuple[str, int, int], tuple[str, str]]:
        found: dict[tuple[str, int, int], tuple[str, str]] = {}
        counts: dict[str, int] = defaultdict(int)
        for file in sorted(folder.rglob("*")):
            if not file.is_file() or file.suffix not in SOLUTION_SUFFIXES:
                continue
            relative = file.relative_to(folder)
            task = self._task_of(relative)
            if task is None:
                self.unmatched.append(str(file))
                continue
            found[(task, counts[task], 0)] = (file.read_text(), str(file))
            counts[task] += 1
        return found

    def _read_jsonl(self, path: Path) -> dict[tuple[str, int, int], tuple[str, str]]:
        found: dict[tuple[str, int, int], tuple[str, str]] = {}
        next_sample: dict[str, int] = defaultdict(int)
        with path.open() as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    task, text = str(row["task_id"]), str(row["completion"])
                except (json.JSONDecodeError, KeyError, TypeError) as exc:
                    raise ValueError(
                        f"{path}:{number}: expected {{'task_id', 'completion'}} ({exc})"
                    ) from exc
                if task not in self.task_ids:
                    self.unmatched.append(f"{path}:{number} ({task})")
                    continue
                turn = int(row.get("turn", 0))
                sample = int(row["sample"]) if "sample" in row else next_sample[task]
                next_sample[task] = max(next_sample[task], sample + 1)
                found[(task, sample, turn)] = (text, f"{path}:{number}")
        return found

    # ------------------------------------------------------------------ client interface
    def samples_for(self, task_id: str) -> int:
        samples = [s for t, s, _ in self.completions if t == task_id]
        return max(samples) + 1 if samples else 0

    def available(self, task_id: str, sample: int, turn: int) -> bool:
        return (task_id, sample, turn) in self.completions

    def generate(self, requests: Sequence[Request]) -> list[Generation]:
        answers = []
        for r in requests:
            key = (r.task_id, r.sample, r.turn)
            answers.append(
                Generation(self.completions[key], "fixed", extra={"origin": self.origins[key]})
            )
        return answers

    def close(self) -> None:
        pass
