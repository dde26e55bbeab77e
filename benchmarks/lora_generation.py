"""Generation of a LoRA policy, side by side, in one run on the same prompts and number of new
tokens: adapters unmerged (each adapted layer runs its base weight plus two low-rank products);
a merged copy made for every batch (``kernelrl.rl.compat.merged_lora_policy``, the copy and
merge counted in its time); and with ``compile_generation`` a merged copy kept across steps,
refreshed in place and decoded with a static KV cache by transformers' compiled, CUDA-graphed
step (the refresh counted; its one-off compilation reported apart).

    python benchmarks/lora_generation.py MODEL [--batch 128] [--new-tokens 128] [--json OUT]

MODEL may be a folder holding only a ``config.json``: the architecture with random weights,
which times the same work (``min_new_tokens`` fixes every row's length).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

from kernelrl.rl.compat import merged_copy, refresh_in_place, static_cache_length


def synchronized_seconds(work: Callable[[], object], device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    work()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


def generate(model: torch.nn.Module, prompts: torch.Tensor, new_tokens: int, **config) -> None:
    settings = GenerationConfig(
        do_sample=True,
        temperature=0.7,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,  # same work for every arm, whatever is sampled
        pad_token_id=0,
        **{"disable_compile": True, **config},
    )
    with torch.no_grad():
        model.generate(
            input_ids=prompts, attention_mask=torch.ones_like(prompts), generation_config=settings
        )


def load(model: str, dtype: torch.dtype, device: str) -> torch.nn.Module:
    if (Path(model) / "config.json").exists() and not any(Path(model).glob("*.safetensors")):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model), dtype=dtype).to(
            device
        )
    return AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=300)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    base = load(args.model, dtype, device)
    lora = LoraConfig(r=8, lora_alpha=32, target_modules="all-linear", init_lora_weights=False)
    adapted = get_peft_model(base, lora).eval()
    generator = torch.Generator().manual_seed(0)
    vocab = adapted.config.vocab_size
    prompts = torch.randint(1, vocab, (args.batch, args.prompt_tokens), generator=generator)
    prompts = prompts.to(device)
    new = args.new_tokens

    generate(adapted, prompts[:, :16], 4)  # warm-up: allocator, kernels
    unmerged = [
        synchronized_seconds(lambda: generate(adapted, prompts, new), device)
        for _ in range(args.repeats)
    ]
    merged = [
        synchronized_seconds(lambda: generate(merged_copy(adapted), prompts, new), device)
        for _ in range(args.repeats)
    ]
    kept = merged_copy(adapted).eval()
    static = {
        "cache_implementation": "static",
        "max_cache_len": static_cache_length(args.prompt_tokens, new),
        "disable_compile": device != "cuda",
    }

    def refreshed_generate() -> None:
        refresh_in_place(kept, merged_copy(adapted))
        generate(kept, prompts, new, **static)

    first_call = synchronized_seconds(refreshed_generate, device)  # compiles, captures graphs
    compiled = [synchronized_seconds(refreshed_generate, device) for _ in range(args.repeats)]
    result = {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "batch": args.batch,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": new,
        "unmerged_s": min(unmerged),
        "merged_s": min(merged),
        "kept_compiled_s": min(compiled),
        "kept_compiled_first_call_s": first_call,
        "merged_over_unmerged": min(unmerged) / min(merged),
        "kept_compiled_over_merged": min(merged) / min(compiled),
    }
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
