"""A user's own model and accounts: LoRA adapters as models, hub models when the user's
environment allows the hub (one line when it does not), wandb online after ``wandb login``.

Nothing here downloads: the hub is either turned off or pointed at a closed local port, and
the adapter tests build a tiny random model in a temporary folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernelrl.launch.adapters import (
    is_adapter,
    load_trainable,
    merged_folder,
    portable_adapter,
    resolve_policy,
)
from kernelrl.launch.errors import UserError
from kernelrl.launch.recipe import keep_user_environment
from kernelrl.launch.wandb_auth import default_wandb_mode, wandb_key_found

REPO = Path(__file__).resolve().parents[2]
UNCACHED = "kernelrl-tests-nobody/no-such-model"


# ------------------------------------------------------------------ hub models
def test_an_uncached_hub_model_with_the_hub_off_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError) as error:
        resolve_policy(UNCACHED)
    message = str(error.value)
    assert "\n" not in message and "not in the local Hugging Face cache" in message
    assert "HF_HUB_OFFLINE=1 keeps the hub off" in message and "HF_HUB_OFFLINE=0" in message


def test_an_unreachable_hub_is_one_line_from_the_cli(tmp_path: Path) -> None:
    """The hub allowed (HF_HUB_OFFLINE unset) but out of reach: exit 2, one line, before the
    engine or the pool start; nothing is downloaded (the endpoint is a closed local port)."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_TOKEN")}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf"))
    done = subprocess.run(
        [sys.executable, "-m", "kernelrl.launch.cli", "eval", "--config"]
        + [str(REPO / "recipes" / "eval" / "smoke_cpu.yaml"), "--model_name_or_path", UNCACHED]
        + ["--output_dir", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env=env,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"kernelrl eval: cannot fetch model '{UNCACHED}' from http://127.0.0.1:9"
    )
    assert "Traceback" not in done.stderr


def test_a_recipes_env_does_not_override_the_users(monkeypatch: pytest.MonkeyPatch) -> None:
    """A recipe's ``env: {HF_HUB_OFFLINE: "1"}`` once kept the hub off whatever the user set."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("KERNELRL_TEST_UNSET", raising=False)
    before = dict(os.environ)
    os.environ["HF_HUB_OFFLINE"] = "1"  # what TRL's parser does with the recipe's env
    os.environ["KERNELRL_TEST_UNSET"] = "x"
    kept = keep_user_environment(before, {"HF_HUB_OFFLINE": "1", "KERNELRL_TEST_UNSET": "x"})
    assert kept == ["HF_HUB_OFFLINE"] and os.environ["HF_HUB_OFFLINE"] == "0"
    assert os.environ["KERNELRL_TEST_UNSET"] == "x"  # unset by the user: the recipe's default


# ------------------------------------------------------------------ wandb
def test_wandb_login_counts_as_a_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL", "NETRC"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    assert not wandb_key_found(home=tmp_path)
    netrc = tmp_path / ".netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password abc123\n")
    netrc.chmod(0o600)
    assert wandb_key_found(home=tmp_path)  # what `wandb login` writes
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.org")
    assert not wandb_key_found(home=tmp_path)  # a key for another host does not count
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "settings").write_text("[default]\napi_key = abc123\n")
    assert wandb_key_found(home=tmp_path)
    assert wandb_key_found({"WANDB_API_KEY": "abc"}, home=tmp_path / "nowhere")


def test_wandb_is_offline_only_without_a_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL", "NETRC"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    assert default_wandb_mode() == "offline"
    monkeypatch.delenv("WANDB_MODE")
    (tmp_path / ".netrc").write_text("machine api.wandb.ai login user password abc123\n")
    (tmp_path / ".netrc").chmod(0o600)
    assert default_wandb_mode() == "online" and "WANDB_MODE" not in os.environ


# ------------------------------------------------------------------ adapters
@pytest.fixture(scope="module")
def tiny_adapter(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(base folder, adapter folder): a 2-layer random Llama and a LoRA adapter of it whose
    weights are not zero (a merge must change the model)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("tiny")
    config = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(root / "base")
    words = {f"w{i}": i for i in range(63)} | {"[UNK]": 63}
    vocabulary = WordLevel(words, unk_token="[UNK]")
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(vocabulary)).save_pretrained(root / "base")
    base = LlamaForCausalLM.from_pretrained(root / "base")  # PEFT records where it came from
    peft = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, param in peft.named_parameters():
            if "lora_B" in name:
                param.normal_()
    peft.save_pretrained(root / "adapter")
    return root / "base", root / "adapter"


def test_an_adapter_folder_resolves_to_its_base(tiny_adapter: tuple[Path, Path]) -> None:
    base, adapter = tiny_adapter
    assert is_adapter(str(adapter)) and not is_adapter(str(base))
    policy = resolve_policy(str(adapter))
    assert (policy.base, policy.base_name, policy.adapter) == (str(base), str(base), str(adapter))


def test_a_broken_adapter_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 8}))
    with pytest.raises(UserError, match="names no base_model_name_or_path"):
        resolve_policy(str(tmp_path))
    (tmp_path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "x/y"}))
    with pytest.raises(UserError, match="no adapter_model.safetensors"):
        resolve_policy(str(tmp_path))


def test_training_continues_the_adapter_and_generation_gets_a_merged_copy(
    tiny_adapter: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("KERNELRL_CACHE", str(tmp_path))
    base, adapter = tiny_adapter
    policy = resolve_policy(str(adapter))
    model = load_trainable(policy, {"dtype": torch.float32})
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert model.peft_config["default"].base_model_name_or_path == str(base)
    # a save names the local base folder; portable_adapter names it as the user did
    model.save_pretrained(tmp_path / "saved")
    assert portable_adapter(tmp_path / "saved", "my-base", str(base)) == str(base)
    saved = json.loads((tmp_path / "saved" / "adapter_config.json").read_text())
    assert saved["base_model_name_or_path"] == "my-base"
    assert str(base) not in (tmp_path / "saved" / "README.md").read_text()
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        expected = model(ids).logits
        merged_path = merged_folder(policy)
        assert merged_folder(policy) == merged_path  # made once
        merged = AutoModelForCausalLM.from_pretrained(merged_path)(ids).logits
        plain = AutoModelForCausalLM.from_pretrained(str(base))(ids).logits
    assert torch.allclose(merged, expected, atol=1e-5)
    assert not torch.allclose(plain, expected, atol=1e-3)  # the adapter does something


def test_an_adapter_naming_its_base_by_name_saves_without_warnings(
    tiny_adapter: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shipped adapter names ``smollm2-135m-instruct``, no folder: PEFT warned on every
    checkpoint that it could not read that base's config. Training uses the local folder."""
    import warnings

    import torch

    import kernelrl.launch.adapters as adapters

    base, adapter = tiny_adapter
    named = tmp_path / "named"
    named.mkdir()
    (named / "adapter_model.safetensors").write_bytes(
        (adapter / "adapter_model.safetensors").read_bytes()
    )
    config = json.loads((adapter / "adapter_config.json").read_text())
    (named / "adapter_config.json").write_text(
        json.dumps({**config, "base_model_name_or_path": "tiny-base"})
    )
    monkeypatch.setattr(
        adapters, "resolve_model", lambda name: str(base) if name == "tiny-base" else name
    )
    policy = resolve_policy(str(named))
    assert (policy.base, policy.base_name) == (str(base), "tiny-base")
    model = load_trainable(policy, {"dtype": torch.float32})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.save_pretrained(tmp_path / "saved")
    assert not [w for w in caught if "Could not find a config file" in str(w.message)]
    portable_adapter(tmp_path / "saved", policy.base_name, policy.base)
    saved = (tmp_path / "saved" / "adapter_config.json").read_text()
    assert json.loads(saved)["base_model_name_or_path"] == "tiny-base"
    assert str(base) not in (tmp_path / "saved" / "README.md").read_text()


def test_an_adapter_is_not_given_a_second_adapter(tiny_adapter: tuple[Path, Path]) -> None:
    from kernelrl.launch.recipe import RecipeError
    from kernelrl.launch.train_cli import parse_train_recipe

    _, adapter = tiny_adapter
    recipe = [
        "--config", str(REPO / "recipes" / "smoke" / "cpu.yaml"),
        "--model_name_or_path", str(adapter), "--use_peft", "true",
    ]  # fmt: skip
    with pytest.raises(RecipeError, match="is a LoRA adapter, which is trained as it is"):
        parse_train_recipe(recipe)


def test_training_logs_to_wandb_offline_without_a_key_and_quietly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from kernelrl.launch.train_cli import _prepare_environment

    for key in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_SILENT", "WANDB_DIR", "NETRC"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    _prepare_environment(SimpleNamespace(report_to=["wandb"], output_dir=str(tmp_path / "run")))
    assert os.environ["WANDB_MODE"] == "offline" and os.environ["WANDB_SILENT"] == "true"
    assert os.environ["WANDB_DIR"] == str((tmp_path / "run").resolve())
