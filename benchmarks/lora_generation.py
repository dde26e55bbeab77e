"""Generation of a LoRA policy, side by side: adapters unmerged (each adapted layer runs its
base weight plus two low-rank products) against the merged copy that
``kernelrl.rl.compat.merged_lora_policy`` builds for every transformers-generated batch (the
copy and merge counted in its time). One run, same prompts, same number of new tokens.

    python benchmarks/lora_generation.py MODEL [--batch 128] [--new-tokens 128] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from kernelrl.rl.compat import merged_copy


def timed_generate(model: torch.nn.Module, prompts: torch.Tensor, new_tokens: int) -> float:
    if prompts.is_cuda:
        torch.cuda.synchronize()
    started = time.perf_counter()
    with torch.no_grad():
        model.generate(
            input_ids=prompts,
            attention_mask=torch.ones_like(prompts),
            do_sample=True,
            temperature=0.7,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,  # same work for both, whatever is sampled
            pad_token_id=0,
        )
    if prompts.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - started


def merged_generate(adapted: torch.nn.Module, prompts: torch.Tensor, new_tokens: int) -> float:
    if prompts.is_cuda:
        torch.cuda.synchronize()
    started = time.perf_counter()
    merged = merged_copy(adapted)
    if prompts.is_cuda:
        torch.cuda.synchronize()
    merging = time.perf_counter() - started
    return merging + timed_generate(merged, prompts, new_tokens)


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
    base = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(device)
    lora = LoraConfig(r=8, lora_alpha=32, target_modules="all-linear", init_lora_weights=False)
    adapted = get_peft_model(base, lora).eval()
    generator = torch.Generator().manual_seed(0)
    vocab = adapted.config.vocab_size
    prompts = torch.randint(1, vocab, (args.batch, args.prompt_tokens), generator=generator)
    prompts = prompts.to(device)

    timed_generate(adapted, prompts[:, :16], 4)  # warm-up: allocator, kernels
    unmerged = [timed_generate(adapted, prompts, args.new_tokens) for _ in range(args.repeats)]
    merged = [merged_generate(adapted, prompts, args.new_tokens) for _ in range(args.repeats)]
    result = {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "batch": args.batch,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "unmerged_s": min(unmerged),
        "merged_s": min(merged),
        "speedup": min(unmerged) / min(merged),
    }
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
