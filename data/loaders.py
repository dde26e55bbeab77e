"""Loaders: KernelBench-format folders, JSONL, Parquet, HF datasets on disk or on the hub.

Every loader yields plain rows with kernelrl's column names; a field mapping renames the
columns of any public corpus (``{"source": "code", "id": "name"}``: our ``source`` is the
corpus's ``code``). Loaders never judge records: a row that is not a usable task is kept and
rejected later, with a reason, by the ``normalize`` step, so that one bad record never aborts a
whole corpus.

A source is written as ``FORMAT:PATH`` (``kernelbench:path/to/level1``, ``jsonl:a.jsonl``,
``parquet:dir_or_file``, ``disk:saved_dataset``, ``hub:org/name#split``), as a bare path whose
format is inferred, or as a mapping with the fields of ``SourceSpec``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
from datasets import Dataset

from kernelrl.data.schema import make_dataset

FORMATS = ("kernelbench", "jsonl", "parquet", "disk", "hub")


class LoaderError(ValueError):
    """A source that cannot be read: missing path, unknown format, unreachable hub."""


@dataclass
class SourceSpec:
    format: str
    path: str
    split: str | None = None
    name: str | None = None  # hub config name
    fields: dict[str, str] = field(default_factory=dict)  # our column -> source column
    backend: str = "triton"
    level: int | None = None
    limit: int | None = None

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise LoaderError(
                f"unknown source format {self.format!r} (known: {', '.join(FORMATS)})"
            )

    @property
    def label(self) -> str:
        return f"{self.format}:{self.path}" + (f"#{self.split}" if self.split else "")


def parse_source(spec: str | Mapping[str, Any] | SourceSpec) -> SourceSpec:
    if isinstance(spec, SourceSpec):
        return spec
    if isinstance(spec, str) and spec.lstrip().startswith("{"):
        spec = json.loads(spec)
    if isinstance(spec, Mapping):
        known = set(SourceSpec.__dataclass_fields__)
        unknown = set(spec) - known
        if unknown:
            raise LoaderError(f"unknown source keys {sorted(unknown)} (known: {sorted(known)})")
        if "path" not in spec:
            raise LoaderError(f"source {dict(spec)} has no path")
        spec = dict(spec)
        if "format" not in spec:
            spec["format"] = infer_format(spec["path"])
        return SourceSpec(**spec)
    prefix, sep, rest = spec.partition(":")
    if sep and prefix in FORMATS:
        path, _, split = rest.partition("#")
        return SourceSpec(format=prefix, path=path, split=split or None)
    return SourceSpec(format=infer_format(spec), path=spec)


def infer_format(path: str) -> str:
    p = Path(path)
    if p.suffix == ".jsonl" or p.suffix == ".json":
        return "jsonl"
    if p.suffix == ".parquet":
        return "parquet"
    if p.is_dir():
        if (p / "dataset_info.json").exists() or (p / "dataset_dict.json").exists():
            return "disk"
        if any(p.rglob("*.parquet")):
            return "parquet"
        return "kernelbench"
    raise LoaderError(
        f"cannot tell the format of {path!r}: write it as FORMAT:PATH ({', '.join(FORMATS)})"
    )


# ---------------------------------------------------------------------- raw rows
def _kernelbench_rows(spec: SourceSpec) -> list[dict[str, Any]]:
    """One row per ``*.py`` file; ``level<N>`` sub-folders (KernelBench's layout) are walked."""
    root = Path(spec.path)
    if not root.is_dir():
        raise LoaderError(f"KernelBench folder {root} does not exist")
    files = sorted(
        (f for f in root.rglob("*.py") if not f.name.startswith("_")),
        key=lambda f: [
            int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(f.relative_to(root)))
        ],
    )
    rows = []
    for file in files:
        level_match = re.search(r"level_?(\d+)", str(file.parent.relative_to(root.parent)))
        rel = file.relative_to(root).with_suffix("")
        rows.append(
            {
                "id": "/".join(rel.parts),
                "source": file.read_text(),
                "level": spec.level
                if spec.level is not None
                else (int(level_match.group(1)) if level_match else None),
            }
        )
    return rows


def _jsonl_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        raise LoaderError(f"JSONL file {path} does not exist")
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise LoaderError(f"{path}:{number}: not a JSON object: {exc.msg}") from exc
    return rows


def _parquet_rows(spec: SourceSpec) -> list[dict[str, Any]]:
    path = Path(spec.path)
    if path.is_dir():
        files = sorted(str(f) for f in path.rglob("*.parquet"))
    else:
        files = [str(path)] if path.exists() else []
    if not files:
        raise LoaderError(f"no Parquet file at {path}")
    return datasets.load_dataset("parquet", data_files=files, split="train").to_list()


def _disk_rows(spec: SourceSpec) -> list[dict[str, Any]]:
    try:
        loaded = datasets.load_from_disk(spec.path)
    except FileNotFoundError as exc:
        raise LoaderError(f"no dataset saved at {spec.path}: {exc}") from exc
    if isinstance(loaded, datasets.DatasetDict):
        split = spec.split or next(iter(loaded))
        if split not in loaded:
            raise LoaderError(f"{spec.path} has no split {split!r} (splits: {list(loaded)})")
        loaded = loaded[split]
    return loaded.to_list()


def _hub_rows(spec: SourceSpec) -> list[dict[str, Any]]:
    try:
        loaded = datasets.load_dataset(spec.path, spec.name, split=spec.split or "train")
    except Exception as exc:  # offline, unknown repo, gated: one clear message
        raise LoaderError(
            f"cannot load {spec.path} from the hub ({type(exc).__name__}: {exc})"
        ) from exc
    return loaded.to_list()


def raw_rows(spec: str | Mapping[str, Any] | SourceSpec) -> list[dict[str, Any]]:
    """The rows of one source with the field mapping applied, untouched otherwise."""
    spec = parse_source(spec)
    if spec.format == "kernelbench":
        rows = _kernelbench_rows(spec)
    elif spec.format == "jsonl":
        rows = _jsonl_rows(Path(spec.path))
    elif spec.format == "parquet":
        rows = _parquet_rows(spec)
    elif spec.format == "disk":
        rows = _disk_rows(spec)
    else:
        rows = _hub_rows(spec)
    if spec.limit is not None:
        rows = rows[: spec.limit]
    return [map_fields(row, spec.fields) for row in rows]


def map_fields(row: Mapping[str, Any], fields: Mapping[str, str]) -> dict[str, Any]:
    """Rename source columns to ours. ``turns.completion: text`` renames a key inside each turn."""
    out = dict(row)
    for ours, theirs in fields.items():
        if "." in ours:
            continue
        if theirs not in row:
            raise LoaderError(
                f"field mapping {ours}: {theirs}: the source has no column {theirs!r} (columns: {sorted(row)})"
            )
        out[ours] = row[theirs]
    turn_fields = {k.split(".", 1)[1]: v for k, v in fields.items() if k.startswith("turns.")}
    if turn_fields and isinstance(out.get("turns"), list):
        out["turns"] = [
            {**t, **{ours: t.get(theirs) for ours, theirs in turn_fields.items()}}
            for t in out["turns"]
        ]
    return out


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


# ---------------------------------------------------------------------- typed datasets
def load_tasks(sources: list[Any]) -> Dataset:
    """RL task rows from every source, in order; ``origin`` says which source each came from."""
    rows = []
    for source in sources:
        spec = parse_source(source)
        for row in raw_rows(spec):
            row.setdefault("backend", spec.backend)
            if not row.get("id"):
                row["id"] = f"task_{_short_hash(str(row.get('source', '')))}"
            row["id"] = str(row["id"]).removesuffix(".py")
            row["origin"] = spec.label
            rows.append(row)
    return make_dataset(rows, "tasks")


def load_samples(sources: list[Any]) -> Dataset:
    """Generated solutions (task_id, prompt, completion, optional EvalResult)."""
    rows = []
    for source in sources:
        spec = parse_source(source)
        for index, row in enumerate(raw_rows(spec)):
            if "task_id" not in row:
                raise LoaderError(
                    f"{spec.label}: sample {index} has no task_id (map one with fields)"
                )
            row.setdefault(
                "id", f"{row['task_id']}/s{index}_{_short_hash(str(row.get('completion', '')))}"
            )
            row["origin"] = spec.label
            rows.append(row)
    return make_dataset(rows, "samples")


def load_trajectories(sources: list[Any]) -> Dataset:
    """Multi-turn rollouts: a first prompt and the turns (completion, feedback, result)."""
    rows = []
    for source in sources:
        spec = parse_source(source)
        for index, row in enumerate(raw_rows(spec)):
            if "task_id" not in row or not isinstance(row.get("turns"), list):
                raise LoaderError(
                    f"{spec.label}: trajectory {index} needs task_id and a list of turns"
                )
            row.setdefault("id", f"{row['task_id']}/t{index}")
            row["origin"] = spec.label
            rows.append(row)
    return make_dataset(rows, "trajectories")


def load_curated(path: str, config: str = "sft", split: str = "train") -> Dataset:
    """A dataset written by ``kernelrl curate`` (``PATH/<config>/*.parquet``), a Parquet file or
    folder, a dataset saved with ``save_to_disk``, or a hub dataset (``config`` as its name)."""
    folder = Path(path)
    if (folder / config).is_dir() and any((folder / config).glob("*.parquet")):
        files = sorted(str(f) for f in (folder / config).glob("*.parquet"))
        return datasets.load_dataset("parquet", data_files=files, split="train")
    if folder.exists():
        spec = SourceSpec(format=infer_format(path), path=path, split=split)
        if spec.format == "parquet":
            files = (
                [str(folder)]
                if folder.is_file()
                else sorted(str(f) for f in folder.rglob("*.parquet"))
            )
            return datasets.load_dataset("parquet", data_files=files, split="train")
        if spec.format == "disk":
            loaded = datasets.load_from_disk(path)
            return loaded[split] if isinstance(loaded, datasets.DatasetDict) else loaded
        if spec.format == "jsonl":
            return datasets.load_dataset("json", data_files=path, split="train")
        raise LoaderError(f"{path} holds no {config}/*.parquet, Parquet, JSONL or saved dataset")
    try:
        return datasets.load_dataset(path, config, split=split)
    except Exception as exc:
        raise LoaderError(
            f"{path} is no local dataset and cannot be loaded from the hub ({type(exc).__name__}: {exc})"
        ) from exc
