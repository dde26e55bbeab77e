"""Contract of kernelrl.rl.compat: every private TRL / transformers / vLLM symbol it relies on
still exists with the signature it assumes. An upgrade that changes one fails HERE, by name,
instead of deep inside a training run."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from kernelrl.rl import compat

ROOT = Path(__file__).resolve().parents[2]


def _parameters(function: object) -> tuple[str, ...]:
    return tuple(inspect.signature(function).parameters)


@pytest.mark.parametrize("name", sorted(compat.GRPO_TRAINER_METHODS))
def test_grpo_trainer_private_methods_keep_their_signatures(name: str) -> None:
    from trl import GRPOTrainer

    assert hasattr(GRPOTrainer, name), f"GRPOTrainer.{name} is gone (kernelrl.rl.compat uses it)"
    assert _parameters(getattr(GRPOTrainer, name)) == compat.GRPO_TRAINER_METHODS[name], (
        f"GRPOTrainer.{name} changed its signature; update kernelrl.rl.compat"
    )


@pytest.mark.parametrize("name", sorted(compat.VLLM_GENERATION_METHODS))
def test_vllm_generation_methods_keep_their_signatures(name: str) -> None:
    from trl.generation.vllm_generation import VLLMGeneration

    assert _parameters(getattr(VLLMGeneration, name)) == compat.VLLM_GENERATION_METHODS[name]


def test_vllm_generation_still_sets_the_attributes_compat_reads() -> None:
    """Read from the source (building a VLLMGeneration needs a vLLM engine)."""
    from trl.generation import vllm_generation

    source = inspect.getsource(vllm_generation.VLLMGeneration)
    for name in compat.VLLM_GENERATION_ATTRIBUTES:
        assert f"self.{name} = " in source, f"VLLMGeneration no longer sets {name}"
    module = inspect.getsource(vllm_generation)
    # engine_kwargs swaps the module's LLM while TRL builds its colocated engine
    assert hasattr(vllm_generation, "LLM") and "self.llm = LLM(" in source
    for key in compat.TRL_LLM_KWARGS:
        assert f"{key}=" in source
    # colocated_generate is a copy of TRL's colocate branch: these are what it mirrors
    for piece in ("SamplingParams(", "extract_logprobs(", "wake_up(tags=", "sleep(level=2)"):
        assert piece in module, piece
    assert _parameters(vllm_generation.extract_logprobs) == ("all_outputs",)
    assert callable(vllm_generation.empty_cache)


def test_grpo_trainer_reads_what_compat_replaces() -> None:
    """TRL still logs the reward metrics that ``trained_reward_metrics`` overwrites, and still
    takes per-token advantages of shape (B, T)."""
    from trl import GRPOTrainer

    source = inspect.getsource(GRPOTrainer)
    for key in ('"reward"', '"reward_std"', '"frac_reward_zero_std"', "rewards/{reward_func_name}"):
        assert key in source, key
    assert "if advantages.dim() == 1:" in source
    assert "self.async_loop_thread, self.async_loop," in source  # async reward functions
    assert "self.rollout_func(prompts, self)" in source
    assert '"env_mask"' in source or "env_mask" in source


def test_vllm_internals_for_the_cpu_weight_sync_exist() -> None:
    pytest.importorskip("vllm")
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod
    from vllm.platforms import current_platform
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    assert callable(current_platform.is_cpu)
    reload = inspect.signature(GPUModelRunner.reload_weights).parameters
    assert "weights_iterator" in reload and "is_checkpoint_format" in reload
    assert (
        "layer"
        in inspect.signature(UnquantizedEmbeddingMethod.process_weights_after_loading).parameters
    )


def test_vllm_cpu_scheduling_keys_exist() -> None:
    """``cpu_seeded_engine_kwargs`` passes these to ``vllm.LLM`` (EngineArgs fields)."""
    pytest.importorskip("vllm")
    from vllm.engine.arg_utils import EngineArgs

    fields = EngineArgs.__dataclass_fields__
    for key in compat.cpu_seeded_engine_kwargs(2048):
        assert key in fields, key
    assert compat.cpu_seeded_engine_kwargs(8192)["max_num_batched_tokens"] == 8192
    assert compat.cpu_seeded_engine_kwargs(None) == {"enable_chunked_prefill": False}


def test_engine_kwargs_override_trls_and_are_removed_afterwards() -> None:
    import trl.generation.vllm_generation as generation_module

    original = generation_module.LLM
    seen = {}

    def fake_llm(**kwargs):  # noqa: ANN003, ANN202
        seen.update(kwargs)

    generation_module.LLM = fake_llm
    try:
        with compat.engine_kwargs({"enforce_eager": True, "max_num_batched_tokens": 8192}):
            generation_module.LLM(max_num_batched_tokens=4096, seed=0)
        assert seen == {"enforce_eager": True, "max_num_batched_tokens": 8192, "seed": 0}
        assert generation_module.LLM is fake_llm
    finally:
        generation_module.LLM = original


def test_server_mode_on_cpu_relies_on_what_exists() -> None:
    """``server_sync.GlooVLLMClient`` (TRL's client over gloo) and ``vllm_gloo`` (a vLLM
    weight-transfer backend): the members they override, call or set, and vLLM's extension
    point, layerwise reload and worker extension."""
    pytest.importorskip("vllm")
    from trl.generation.vllm_client import VLLMClient
    from trl.scripts.vllm_serve import ScriptArguments, build_command
    from vllm.distributed.weight_transfer.base import WeightTransferEngine
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    from vllm.model_executor.model_loader import reload

    for name in compat.VLLM_CLIENT_MEMBERS:
        assert callable(getattr(VLLMClient, name)), name
    source = inspect.getsource(VLLMClient)
    for name in compat.VLLM_CLIENT_ATTRIBUTES:
        assert f"self.{name} =" in source, name
    for name in compat.VLLM_WEIGHT_TRANSFER_METHODS:
        assert callable(getattr(WeightTransferEngine, name)), name
    assert isinstance(WeightTransferEngineFactory._registry, dict)
    assert callable(reload.initialize_layerwise_reload)
    assert callable(reload.finalize_layerwise_reload)
    command = build_command(ScriptArguments(model="m"))
    assert command[command.index("--weight-transfer-config") + 1] == '{"backend": "nccl"}'
    assert command[command.index("serve") + 1] == "m"

    from kernelrl.rl.vllm_gloo import BACKEND, GlooWeightTransferEngine

    assert WeightTransferEngineFactory._registry[BACKEND]() is GlooWeightTransferEngine


def test_server_client_swaps_trls_client_and_restores_it() -> None:
    pytest.importorskip("vllm")
    import trl.generation.vllm_generation as generation_module

    from kernelrl.rl.server_sync import GlooVLLMClient

    original = generation_module.VLLMClient
    with compat.server_client(GlooVLLMClient):
        assert generation_module.VLLMClient is GlooVLLMClient
    assert generation_module.VLLMClient is original
    with compat.server_client(None):
        assert generation_module.VLLMClient is original


def test_trainer_touches_no_private_library_symbol_outside_compat() -> None:
    """The trainer and the weight sync reach TRL / transformers / vLLM privates only through
    compat: no ``super()._x``, no ``self._x`` of TRL's, no private imports."""
    import re

    trl_private = {
        "_generate_single_turn",
        "_tokenize_prompts",
        "_last_loaded_step",
        "_step",
        "_buffered_inputs",
        "_metrics",
        "_logs",
        "_tokenizer",
        "_log_metric",
        "_iter_named_params",
        "_llm_weights_sleeping",
        "_get_output_dir",
    }
    for name in ("trainer.py", "steps.py", "metrics.py", "weight_sync.py"):
        path = ROOT / "rl" / name
        text = path.read_text()
        assert not re.search(r"super\(\)\._[a-z]", text), path
        used = set(re.findall(r"\.(_[a-z_]+)\b", text))
        assert not used & trl_private, (path, used & trl_private)
        assert "trl.trainer.utils" not in text and "trl.generation" not in text, path


def test_trainer_instance_has_the_attributes_compat_reads(tmp_path: Path) -> None:
    """Attributes GRPOTrainer sets in ``__init__`` (a tiny model, transformers generation)."""
    from rl_support import VerdictPool, tiny_trainer

    from kernelrl.env.result import Status

    trainer = tiny_trainer(tmp_path, VerdictPool(lambda *_: Status.FORMAT_ERROR))
    for name in compat.GRPO_TRAINER_ATTRIBUTES:
        assert hasattr(trainer, name), f"GRPOTrainer no longer sets {name}"
    assert set(compat.resume_state(trainer)) == {"step", "buffered_inputs"}
    assert isinstance(compat.metrics(trainer, "train"), dict)
