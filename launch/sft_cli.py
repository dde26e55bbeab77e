"""``kernelrl sft``: supervised warm start on a curated dataset, before RL.

    kernelrl sft --config recipes/smollm2/sft/smoke_cpu.yaml [--key value ...]
    accelerate launch --config_file recipes/accelerate_configs/zero3.yaml \\
        -m kernelrl.launch.cli sft --config recipes/qwen3-8b/sft/kernel_sft.yaml

TRL's ``SFTTrainer`` does the work; the recipe is one flat YAML parsed by ``trl.TrlParser``
into ``SFTScriptArguments`` (which data), ``trl.SFTConfig`` (how to train) and
``trl.ModelConfig`` (which model, LoRA). The curated rows are conversational prompt-completion
pairs (``kernelrl.data.schema.SFT_FEATURES``), so TRL applies the model's chat template and,
by default, computes the loss on the completion only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelrl.launch.recipe import add_recipe_command, parse_recipe, resume_argument

USAGE = """usage: kernelrl sft --config RECIPE.yaml [--key value ...]

Every SFTConfig / ModelConfig / script key can be given as a flag (--max_steps 10);
`kernelrl sft --help` lists them."""


@dataclass
class SFTScriptArguments:
    """Which data to train on (the model comes from ModelConfig, the training from SFTConfig)."""

    dataset_path: str = field(
        default="", metadata={"help": "curate output dir, Parquet, saved dataset or hub id"}
    )
    dataset_config: str = field(
        default="sft", metadata={"help": "config of a curated dataset (sft)"}
    )
    eval_fraction: float = field(
        default=0.0, metadata={"help": "share of rows held out for evaluation"}
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "use at most this many rows"}
    )


def add_subcommand(commands: Any) -> None:
    add_recipe_command(
        commands,
        "sft",
        help="SFT warm start on a curated dataset (TRL SFTTrainer)",
        run=_sft,
        recipe_types=_recipe_types,
        usage=USAGE,
    )


def _recipe_types() -> tuple[type, ...]:
    from trl import ModelConfig, SFTConfig

    return (SFTScriptArguments, SFTConfig, ModelConfig)


def load_sft_data(script: SFTScriptArguments, seed: int) -> tuple[Any, Any]:
    """(train, eval or None) with only the columns TRL trains on."""
    from kernelrl.data.loaders import load_curated

    if not script.dataset_path:
        raise ValueError(
            "dataset_path is required (a `kernelrl curate` output folder, for example)"
        )
    dataset = load_curated(script.dataset_path, script.dataset_config)
    missing = {"prompt", "completion"} - set(dataset.column_names)
    if missing:
        raise ValueError(
            f"{script.dataset_path} has no {sorted(missing)} column: not an SFT dataset"
        )
    if len(dataset) == 0:
        raise ValueError(f"{script.dataset_path} holds no SFT example")
    dataset = dataset.select_columns(["prompt", "completion"])
    if script.max_train_samples is not None:
        dataset = dataset.select(range(min(script.max_train_samples, len(dataset))))
    if script.eval_fraction > 0 and len(dataset) > 1:
        split = dataset.train_test_split(test_size=script.eval_fraction, seed=seed)
        return split["train"], split["test"]
    return dataset, None


def run_sft(script: SFTScriptArguments, training_args: Any, model_args: Any) -> dict[str, Any]:
    """Train, save the model, and return the final metrics and the logged history."""
    from trl import SFTTrainer, get_peft_config

    from kernelrl.launch.adapters import resolve_base
    from kernelrl.launch.models import check_model_value

    check_model_value(model_args.model_name_or_path)  # a typo fails before the data loads
    train, held_out = load_sft_data(script, training_args.seed)
    model_path = resolve_base(model_args.model_name_or_path)  # a hub id: cached or reachable
    init_kwargs = dict(training_args.model_init_kwargs or {})
    if model_args.dtype not in (None, "auto"):
        init_kwargs.setdefault("dtype", model_args.dtype)
    if model_args.attn_implementation:
        init_kwargs.setdefault("attn_implementation", model_args.attn_implementation)
    training_args.model_init_kwargs = init_kwargs
    if held_out is None and training_args.eval_strategy != "no":
        training_args.eval_strategy = "no"
    trainer = SFTTrainer(
        model=model_path,
        args=training_args,
        train_dataset=train,
        eval_dataset=held_out,
        peft_config=get_peft_config(model_args),
    )
    if len(trainer.train_dataset) == 0:  # TRL drops examples whose completion was cut off
        raise ValueError(
            f"no SFT example is left after tokenization: every completion lies beyond max_length"
            f" ({training_args.max_length} tokens); raise max_length or shorten the prompts"
        )
    output = trainer.train(
        resume_from_checkpoint=resume_argument(
            training_args.resume_from_checkpoint, training_args.output_dir
        )
    )
    trainer.save_model(training_args.output_dir)
    if trainer.is_world_process_zero():
        from kernelrl.launch.adapters import portable_adapter

        portable_adapter(training_args.output_dir, model_args.model_name_or_path)
    summary = {
        "model": model_path,
        "train_rows": len(train),
        "eval_rows": len(held_out) if held_out is not None else 0,
        "global_step": output.global_step,
        "metrics": output.metrics,
        "log_history": trainer.state.log_history,
    }
    if trainer.is_world_process_zero():
        Path(training_args.output_dir).mkdir(parents=True, exist_ok=True)
        (Path(training_args.output_dir) / "sft_summary.json").write_text(
            json.dumps(summary, indent=1, default=str)
        )
    return summary


def _sft(words: list[str]) -> int:
    script, training_args, model_args = parse_recipe(words, _recipe_types(), "kernelrl sft")
    if "wandb" in (training_args.report_to or []):
        from kernelrl.launch.wandb_auth import default_wandb_mode

        default_wandb_mode()  # offline (sync later) unless wandb finds a key: never ask for one
    summary = run_sft(script, training_args, model_args)
    losses = [entry["loss"] for entry in summary["log_history"] if "loss" in entry]
    print(
        f"sft: {summary['global_step']} steps on {summary['train_rows']} examples; "
        f"loss {losses[0]:.4f} -> {losses[-1]:.4f}"
        if losses
        else f"sft: {summary['global_step']} steps",
        f"; model saved to {training_args.output_dir}",
        sep="",
    )
    return 0
