"""What the GPU training benchmark trains: a tiny Llama with SmolLM2-135M's tokenizer and
architecture (randomly initialised), and SFT data that teaches it the bundled solutions of the
RL tasks with the prompts RL samples from."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SFT_RECIPE = "recipes/gpu/sft_tiny.yaml"
TRAIN_RECIPE = "recipes/gpu/trloo_tiny.yaml"
TASKS = "01_relu,02_gelu_tanh"  # the RL tasks; the SFT data holds their bundled solutions
TINY = {  # SmolLM2-135M is 30 layers of width 576 (intermediate 1536, 9 heads, 3 kv heads)
    "num_hidden_layers": 4,
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
}
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "generation_config.json",
    "config.json",
)


# ---------------------------------------------------------------------- prepare
def copy_tokenizer(source: Path, target: Path) -> None:
    """The files of SmolLM2's HF folder that a tiny model of the same family needs (no weights:
    about 3.5 MB, so they can travel to the GPU machine)."""
    target.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, target / name)
    if not (target / "tokenizer.json").is_file() or not (target / "config.json").is_file():
        raise SystemExit(f"{source}: no tokenizer.json / config.json (not an HF model folder)")


def make_tiny_model(tokenizer_dir: Path, target: Path, seed: int = 0) -> dict[str, Any]:
    """SmolLM2's config with fewer, narrower layers, randomly initialised with ``seed``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(str(tokenizer_dir))
    for key, value in TINY.items():
        setattr(config, key, value)
    config.torch_dtype = "float32"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(target), safe_serialization=True)
    AutoTokenizer.from_pretrained(str(tokenizer_dir)).save_pretrained(str(target))
    params = sum(p.numel() for p in model.parameters())
    return {"model": str(target), "parameters": params, **TINY}


def make_sft_data(target: Path, tasks: str = TASKS) -> int:
    """One SFT row per RL task: the prompt RL uses (same builder, same system message) and the
    bundled solution as the assistant's answer in a fenced block."""
    from types import SimpleNamespace

    import pandas as pd

    from kernelrl.data.bundled import bundled_solution_path
    from kernelrl.launch.train_cli import build_task_dataset

    args = SimpleNamespace(
        tasks=["bundled"],
        task_backend="triton",
        task_filter=tasks,
        task_categories="",
        task_difficulty="",
        max_tasks=None,
        system_prompt="default",
        prompt_template=None,
    )
    rows = []
    for row in build_task_dataset(args):
        solution = bundled_solution_path(row["id"]).read_text()
        rows.append(
            {
                "prompt": list(row["prompt"]),
                "completion": [
                    {"role": "assistant", "content": f"```python\n{solution.strip()}\n```"}
                ],
            }
        )
    target.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(target / "train.parquet")
    return len(rows)
