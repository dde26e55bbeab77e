"""The solutions of the KernelBench side-by-side benchmark: each file of
``benchmarks/kernelbench_solutions/`` names the KernelBench task it solves in a header, and its
results are kept per solution (``Row``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HEADER = re.compile(r"^# kernelbench: (level\d+/[^\s]+\.py)\s*$", re.M)


@dataclass
class Entry:
    """One solution file and the KernelBench task it solves."""

    stem: str
    task_rel: str  # "level1/19_ReLU.py"
    solution_path: Path
    solution_src: str
    task_src: str = ""

    @property
    def level(self) -> int:
        return int(self.task_rel.split("/")[0].removeprefix("level"))

    @property
    def key(self) -> str:
        return self.task_rel.removesuffix(".py")


@dataclass
class Row:
    kernelrl: list[dict[str, Any]] = field(default_factory=list)
    kb_inproc: dict[str, Any] | None = None
    kb_subproc: dict[str, Any] | None = None


# ----------------------------------------------------------------------------- solutions
def task_rel_of(solution_src: str) -> str:
    """The ``levelN/<file>.py`` a solution names in its header comment."""
    match = HEADER.search(solution_src)
    if not match:
        raise ValueError("solution has no '# kernelbench: levelN/<task>.py' header")
    return match.group(1)


def solution_entries(
    solutions_dir: Path, kernelbench_dir: Path | None = None, only: set[str] | None = None
) -> list[Entry]:
    """Every solution of the folder, with its task source when ``kernelbench_dir`` is given.

    The header must name a task file with the solution's own stem: a mismatch is a mistake.
    """
    entries = []
    for path in sorted(solutions_dir.glob("*.py")):
        if path.name.startswith("_"):
            continue
        src = path.read_text()
        rel = task_rel_of(src)
        if Path(rel).stem != path.stem:
            raise ValueError(f"{path}: header names {rel}, not a task called {path.stem}")
        if only and path.stem not in only and rel.removesuffix(".py") not in only:
            continue
        entry = Entry(path.stem, rel, path, src)
        if kernelbench_dir is not None:
            entry.task_src = (kernelbench_dir / rel).read_text()
        entries.append(entry)
    return entries
