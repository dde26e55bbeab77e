"""The generation copy of asynchronous training computes with its own weights: TRL patches the
policy's forward on the instance (and accelerate's mixed precision wraps it again), in closures
that name the original model, so a plain deep copy runs the live policy. Seconds on CPU."""

from __future__ import annotations

import copy
import types
from pathlib import Path

import pytest
import torch
from rl_support import tiny_model

from kernelrl.rl.policy_copy import detached_copy


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_model(tmp_path_factory.mktemp("tiny"))


def patched(model_dir: str) -> torch.nn.Module:
    """The tiny model with the instance-level forwards a training run gives it: TRL's fused LM
    head, then accelerate's fp32-output wrapper (as ``Accelerator.prepare_model`` installs it)."""
    from accelerate.utils import convert_outputs_to_fp32
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    add_fused_lm_head(model)
    model.forward = types.MethodType(convert_outputs_to_fp32(model.forward.__func__), model)
    return model


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([[1, 5, 9, 13]])).logits


def perturb(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)


def test_a_detached_copy_keeps_its_weights_when_the_policy_changes(model_dir: str) -> None:
    model = patched(model_dir)
    before = logits(model)
    plain, detached = copy.deepcopy(model), detached_copy(model)
    perturb(model)
    assert not torch.equal(logits(model), before)
    # the premise: a plain deep copy follows the live policy
    assert torch.equal(logits(plain), logits(model)), "TRL no longer patches forward in a closure"
    assert torch.equal(logits(detached), before)
    # and it decodes with a KV cache while the policy trains with gradient checkpointing
    model.gradient_checkpointing_enable()
    model.train()
    ids = torch.tensor([[1, 5, 9]])
    with torch.no_grad():
        out = detached.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, do_sample=False
        )
    assert out.shape == (1, 5)


def test_a_merged_lora_copy_is_detached_too(model_dir: str, tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        patched(model_dir),
        LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False),
    )
    before = logits(model)
    merged = detached_copy(model).merge_and_unload()
    assert torch.allclose(logits(merged), before, atol=1e-5)
    perturb(model)
    assert torch.allclose(logits(merged), before, atol=1e-5)
    assert not torch.allclose(logits(model), before, atol=1e-2)
