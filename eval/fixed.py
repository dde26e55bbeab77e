"""Fixed solutions: a "client" that replays given completions instead of sampling a model.

Why: a sweep over known solutions (reference solutions, a previous model's outputs, solutions
written to be wrong) checks the whole evaluation and reporting path with answers known in
advance, and scores completions produced elsewhere with exactly the same metrics.

Sources, each adding samples to the tasks it covers (sample numbers continue across sources):

- a folder, read by file path relative to it (suffixes .py, .txt, .md, .cu):

  - ``<task id>/<label>.py``: **the layout that cannot clash**, for any task id (KernelBench's
    ``level1/1_Square_matrix_multiplication_``, ids with ``__`` or dots inside): every file in
    the task's folder is one sample, in name order; the label is free text;
  - ``<task id>.py``: one sample (``01_relu.py``, ``level1/1_Square_matrix_multiplication_.py``);
  - ``<task id>__<label>.py`` (the older flat layout): read where exactly one task id fits, by
    trying every ``__`` of the name as the separator (so ``35_GroupNorm___a.py`` is task
    ``35_GroupNorm_`` when only that id fits). A name that two task ids fit (ids ``a`` and
    ``a_``, file ``a___b.py``; or a file that is one task's ``<id>.py`` and another's
    ``<id>__<label>.py``) is refused with one line naming both: move it to ``<task id>/``.

- a JSONL file: rows ``{"task_id", "completion"}`` with optional ``"sample"`` and ``"turn"``
  (default: the next sample of the task, turn 0; turns count from 0 unless the row has
  ``"turn_base": 1``, as the lines of a sweep's ``samples.jsonl`` do, so a sweep's store can be
  replayed as it is). Rows for later turns replay refinement.

A task that no source covers gets no samples: the sweep counts it as failed with the reason
``no solution`` (it is listed, never dropped from the denominators).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from kernelrl.eval.clients import Generation, Request

SOLUTION_SUFFIXES = {".py", ".txt", ".md", ".cu"}
RECORDED = ("finish_reason", "prompt_tokens", "completion_tokens")


class FixedSolutions:
    name = "fixed"

    def __init__(self, sources: Sequence[str | Path], task_ids: Iterable[str]) -> None:
        self.task_ids = set(task_ids)
        self.completions: dict[tuple[str, int, int], str] = {}
        self.origins: dict[tuple[str, int, int], str] = {}
        # What a sweep recorded of how each completion ended (finish_reason, token counts):
        # replayed, so that a token-limit answer is still one when judged again.
        self.recorded: dict[tuple[str, int, int], dict] = {}
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
        for (task, sample, turn), (text, origin, recorded) in found.items():
            key = (task, offset[task] + sample, turn)
            self.completions[key] = text
            self.origins[key] = origin
            self.recorded[key] = recorded

    def _task_of(self, relative: Path) -> str | None:
        """The task a solution file belongs to, or None; ValueError where two tasks fit."""
        parent = relative.parent.as_posix()
        if parent in self.task_ids:  # <task id>/<label>.py: unambiguous by construction
            return parent
        stem = relative.name[: -len(relative.suffix)] if relative.suffix else relative.name
        prefix = "" if parent == "." else parent + "/"
        candidates = [prefix + stem] if prefix + stem in self.task_ids else []
        start = stem.find("__")
        while start != -1:  # every "__" may be the separator; id and label must not be empty
            if 0 < start < len(stem) - 2 and prefix + stem[:start] in self.task_ids:
                candidates.append(prefix + stem[:start])
            start = stem.find("__", start + 1)
        if len(candidates) > 1:
            raise ValueError(
                f"fixed solutions: {relative.as_posix()} fits tasks {' and '.join(candidates)}; "
                "move it to <task id>/<label>.py"
            )
        return candidates[0] if candidates else None

    def _read_folder(self, folder: Path) -> dict[tuple[str, int, int], tuple[str, str, dict]]:
        found: dict[tuple[str, int, int], tuple[str, str, dict]] = {}
        counts: dict[str, int] = defaultdict(int)
        for file in sorted(folder.rglob("*")):
            if not file.is_file() or file.suffix not in SOLUTION_SUFFIXES:
                continue
            relative = file.relative_to(folder)
            task = self._task_of(relative)
            if task is None:
                self.unmatched.append(str(file))
                continue
            found[(task, counts[task], 0)] = (file.read_text(), str(file), {})
            counts[task] += 1
        return found

    def _read_jsonl(self, path: Path) -> dict[tuple[str, int, int], tuple[str, str, dict]]:
        found: dict[tuple[str, int, int], tuple[str, str, dict]] = {}
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
                # 0-based unless the row says otherwise (a sweep's samples.jsonl: turn_base 1)
                base = int(row.get("turn_base", 0))
                turn = int(row.get("turn", base)) - base
                sample = int(row["sample"]) if "sample" in row else next_sample[task]
                next_sample[task] = max(next_sample[task], sample + 1)
                recorded = {k: row[k] for k in RECORDED if row.get(k) is not None}
                found[(task, sample, turn)] = (text, f"{path}:{number}", recorded)
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
            recorded = {"finish_reason": "fixed", **self.recorded[key]}
            answers.append(
                Generation(self.completions[key], **recorded, extra={"origin": self.origins[key]})
            )
        return answers

    def close(self) -> None:
        pass
