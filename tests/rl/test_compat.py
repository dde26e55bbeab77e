"""Contract of kernelrl.rl.compat (listed in kernelrl.rl.compat_contract): the installed TRL,
transformers and vLLM are the versions every private touch was read from, and every private
symbol still exists with the signature it assumes; TRL code that was copied is unchanged. An
upgrade that changes one fails HERE, by name, instead of deep inside a training run."""

from __future__ import annotations

import hashlib
import importlib
import inspect
import os
import re
from pathlib import Path

import pytest

from kernelrl.rl import compat
from kernelrl.rl import compat_contract as contract

ROOT = Path(__file__).resolve().parents[2]


def _parameters(function: object) -> tuple[str, ...]:
    return tuple(inspect.signature(function).parameters)


def _resolve(dotted: str) -> object:
    """``package.module.Class.attribute`` -> the object, importing the longest module prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name)
        return found
    raise ImportError(dotted)


def _sets(source: str, name: str) -> bool:
    """Whether ``source`` assigns ``self.<name>`` (annotated or not)."""
    return re.search(rf"self\.{name}\b\s*(:[^=\n]*)?=[^=]", source) is not None


@pytest.mark.parametrize("library", sorted(contract.READ_FROM))
def test_installed_versions_are_the_ones_the_touches_were_read_from(library: str) -> None:
    """A different TRL, transformers or vLLM may have changed any touch, also in ways no
    signature shows: re-read each against the new version, then update ``READ_FROM``."""
    module = pytest.importorskip(library) if library == "vllm" else importlib.import_module(library)
    assert module.__version__ == contract.READ_FROM[library], (
        f"{library} {module.__version__} is installed; kernelrl.rl.compat_contract was read from "
        f"{contract.READ_FROM[library]}: re-read every touch it lists, then update READ_FROM"
    )


@pytest.mark.parametrize("name", sorted(contract.GRPO_TRAINER_METHODS))
def test_grpo_trainer_private_methods_keep_their_signatures(name: str) -> None:
    from trl import GRPOTrainer

    assert name in vars(GRPOTrainer), f"GRPOTrainer.{name} is gone (kernelrl.rl.compat uses it)"
    assert _parameters(getattr(GRPOTrainer, name)) == contract.GRPO_TRAINER_METHODS[name], (
        f"GRPOTrainer.{name} changed its signature; update kernelrl.rl.compat"
    )


@pytest.mark.parametrize("name", sorted(contract.TRAINER_METHODS))
def test_transformers_trainer_methods_keep_their_signatures(name: str) -> None:
    from transformers import Trainer
    from trl import GRPOTrainer

    assert name in vars(Trainer), f"Trainer.{name} is gone (kernelrl.rl.compat overrides it)"
    for owner in (Trainer, GRPOTrainer):
        assert _parameters(getattr(owner, name)) == contract.TRAINER_METHODS[name], (owner, name)


def test_checkpoints_are_followed_by_the_public_on_save() -> None:
    """``SaveKernelrlState`` writes kernelrl's state from ``on_save``: transformers must still
    fire it right after every checkpoint, into ``output_dir/checkpoint-<step>``, and the
    hooks must not override the private save any more."""
    from transformers import Trainer
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    source = inspect.getsource(Trainer)
    saves = re.findall(r"self\._save_checkpoint\(.*\)\n\s*(.*)", source)
    assert saves and all("self.callback_handler.on_save(" in after for after in saves), saves
    assert 'checkpoint_folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"' in source
    assert "run_dir = self.args.output_dir" in source  # _get_output_dir without a search
    assert PREFIX_CHECKPOINT_DIR == "checkpoint"
    assert "_save_checkpoint" not in vars(compat.GRPOHooks)


def test_save_callback_writes_into_the_checkpoint_folder(tmp_path: Path) -> None:
    from transformers import TrainerControl, TrainerState

    written = []

    class Trainer:
        def save_state(self, folder: str) -> None:
            written.append(folder)

    state = TrainerState()
    state.global_step = 7
    args = type("Args", (), {"output_dir": str(tmp_path)})()
    compat.SaveKernelrlState(Trainer()).on_save(args, state, TrainerControl())
    assert written == [os.path.join(str(tmp_path), "checkpoint-7")]


@pytest.mark.parametrize("name", sorted(contract.VLLM_GENERATION_METHODS))
def test_vllm_generation_methods_keep_their_signatures(name: str) -> None:
    from trl.generation.vllm_generation import VLLMGeneration

    assert _parameters(getattr(VLLMGeneration, name)) == contract.VLLM_GENERATION_METHODS[name]


@pytest.mark.parametrize("original", sorted(contract.COPIED_TRL_CODE))
def test_copied_trl_code_is_unchanged_upstream(original: str) -> None:
    """kernelrl holds a copy of (part of) this TRL function: if TRL changes it, the copy must
    be re-read against the new code before the hash here is updated."""
    digest, copy = contract.COPIED_TRL_CODE[original]
    source = inspect.getsource(_resolve(original))
    assert hashlib.sha256(source.encode()).hexdigest() == digest, (
        f"{original} changed upstream; re-read {copy} (its copy) against it"
    )
    assert callable(_resolve(copy))


def test_vllm_generation_still_sets_the_attributes_compat_reads() -> None:
    """Read from the source (building a VLLMGeneration needs a vLLM engine)."""
    from trl.generation import vllm_generation

    source = inspect.getsource(vllm_generation.VLLMGeneration)
    for name in contract.VLLM_GENERATION_ATTRIBUTES:
        assert f"self.{name} = " in source, f"VLLMGeneration no longer sets {name}"
    for name in contract.VLLM_GENERATION_MODULE_NAMES:
        assert hasattr(vllm_generation, name), f"trl.generation.vllm_generation.{name} is gone"
    module = inspect.getsource(vllm_generation)
    # engine_kwargs swaps the module's LLM while TRL builds its colocated engine
    assert hasattr(vllm_generation, "LLM") and "self.llm = LLM(" in source
    for key in contract.TRL_LLM_KWARGS:
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
    for name in contract.GRPO_TRAINER_VLLM_ATTRIBUTES:
        assert _sets(source, name), f"GRPOTrainer no longer sets {name}"
    for key in ('"reward"', '"reward_std"', '"frac_reward_zero_std"', "rewards/{reward_func_name}"):
        assert key in source, key
    assert "if advantages.dim() == 1:" in source
    assert "self.async_loop_thread, self.async_loop," in source  # async reward functions
    assert "self.rollout_func(prompts, self)" in source
    assert '"env_mask"' in source or "env_mask" in source


def test_vllm_internals_for_the_cpu_weight_sync_exist() -> None:
    pytest.importorskip("vllm")
    from vllm.platforms import current_platform

    assert callable(current_platform.is_cpu)
    for dotted, names in contract.VLLM_METHODS.items():
        parameters = inspect.signature(_resolve(dotted)).parameters
        assert all(name in parameters for name in names), (dotted, list(parameters))
    # llm.llm_engine.model_executor.driver_worker.model_runner: each link still set
    for owner, attribute in contract.VLLM_MODEL_RUNNER_PATH:
        assert _sets(inspect.getsource(_resolve(owner)), attribute), f"{owner}.{attribute}"
    wrapper = _resolve(contract.VLLM_MODEL_RUNNER_PATH[3][0])
    assert "__getattr__" in vars(wrapper), "the driver worker no longer forwards to its worker"


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

    for name in contract.VLLM_CLIENT_MEMBERS:
        assert callable(getattr(VLLMClient, name)), name
    source = inspect.getsource(VLLMClient)
    for name in contract.VLLM_CLIENT_ATTRIBUTES:
        assert f"self.{name} =" in source, name
    for name in contract.VLLM_WEIGHT_TRANSFER_METHODS:
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
    compat: no ``super()._x``, no ``self._x`` of TRL's (every private name the contract lists),
    no private imports."""
    tables = (
        contract.GRPO_TRAINER_METHODS,
        contract.GRPO_TRAINER_ATTRIBUTES,
        contract.GRPO_TRAINER_VLLM_ATTRIBUTES,
        contract.TRAINER_METHODS,
        contract.VLLM_GENERATION_METHODS,
        contract.VLLM_GENERATION_ATTRIBUTES,
    )
    trl_private = {name for table in tables for name in table if name.startswith("_")}
    assert {"_step", "_iter_named_params", "_load_optimizer_and_scheduler"} <= trl_private
    for name in ("trainer.py", "steps.py", "metrics.py", "weight_sync.py"):
        path = ROOT / "rl" / name
        text = path.read_text()
        assert not re.search(r"super\(\)\._[a-z]", text), path
        used = set(re.findall(r"\.(_[a-z_]+)\b", text))
        assert not used & trl_private, (path, used & trl_private)
        assert "trl.trainer.utils" not in text and "trl.generation" not in text, path


def test_trainer_instance_has_the_attributes_compat_reads(tmp_path: Path) -> None:
    """Attributes GRPOTrainer sets in ``__init__`` (a tiny model, transformers generation), and
    the save callback the hooks register."""
    from rl_support import VerdictPool, tiny_trainer

    from kernelrl.env.result import Status

    trainer = tiny_trainer(tmp_path, VerdictPool(lambda *_: Status.FORMAT_ERROR))
    for name in contract.GRPO_TRAINER_ATTRIBUTES:
        assert hasattr(trainer, name), f"GRPOTrainer no longer sets {name}"
    callbacks = trainer.callback_handler.callbacks
    assert sum(isinstance(c, compat.SaveKernelrlState) for c in callbacks) == 1
    assert set(compat.resume_state(trainer)) == {"step", "buffered_inputs"}
    assert isinstance(compat.metrics(trainer, "train"), dict)
