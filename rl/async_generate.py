"""Generation that runs beside the update: the three generators of asynchronous training.

A generator is called from the rollout threads of ``kernelrl.rl.async_rollout`` while the main
thread trains, so it may use nothing the training step uses at the same time: no collective
(a gather issued from a second thread would interleave with DDP's), no trainer attribute that a
step changes, and no weights that the optimizer writes in place. Each generator therefore has
its own copy of the policy, which ``load_weights`` refreshes from the main thread while
generation is paused (the engine's lock), and which carries one policy version.

- ``ServerGenerator`` (``vllm_mode: server``): every rank sends its own requests to the vLLM
  server over HTTP with a TRL ``VLLMClient`` of its own (TRL's generation gathers every rank's
  prompts to rank 0, a collective). The weights are pushed with TRL's ``sync_weights`` between
  two barriers, so that no rank has a request in flight while the server's weights change.
- ``ColocatedGenerator`` (``vllm_mode: colocate``, tensor parallel 1): the in-process engine,
  seeded per request as the synchronous path; weights loaded by the installed sync.
- ``SnapshotGenerator`` (``use_vllm: false``): transformers' ``generate`` on a copy of the
  policy (a LoRA policy merged into it; ``policy_copy.detached_copy``, since a plain deep copy
  of TRL's policy runs the live model), on a CUDA stream of its own, with the sampling settings
  of TRL's transformers path; it also scores what it sampled (the behaviour log-probabilities,
  which vLLM reports itself), for the importance weights of stale samples.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from kernelrl.rl import compat
from kernelrl.rl.policy_copy import detached_copy

Completions = tuple[list[list[int]], list[list[float | None]] | None]


class Generator(Protocol):
    """What the rollout threads sample from."""

    def generate(
        self, contexts: list[list[int]], max_new_tokens: int, seeds: list[int] | None
    ) -> Completions: ...

    def load_weights(self) -> None:
        """Called from the main thread with generation paused: take the trainer's weights."""


def make_generator(trainer: Any) -> Generator:
    """The generator of the trainer's topology (see the module docstring)."""
    if not trainer.use_vllm:
        return SnapshotGenerator(trainer)
    if trainer.vllm_generation.mode == "server":
        return ServerGenerator(trainer)
    return ColocatedGenerator(trainer)


class ServerGenerator:
    """Each rank's own requests to the vLLM server (see the module docstring)."""

    def __init__(self, trainer: Any) -> None:
        from trl.generation.vllm_client import VLLMClient

        args = trainer.args
        base_url = args.vllm_server_base_url or (
            f"http://{args.vllm_server_host}:{args.vllm_server_port}"
        )
        self.trainer = trainer
        self.generation = trainer.vllm_generation
        self.client = VLLMClient(base_url=base_url, connection_timeout=args.vllm_server_timeout)

    def generate(
        self, contexts: list[list[int]], max_new_tokens: int, seeds: list[int] | None
    ) -> Completions:
        if not contexts:
            return [], []
        g = self.generation
        output = self.client.generate(
            prompts=contexts,
            n=1,
            repetition_penalty=g.repetition_penalty,
            temperature=g.temperature,
            top_p=g.top_p,
            top_k=g.top_k,
            min_p=0.0 if g.min_p is None else g.min_p,
            max_tokens=max_new_tokens,
            logprobs=g.logprobs,
            generation_kwargs=g.generation_kwargs,
        )
        ids = [list(seq) for seq in output["completion_ids"]]
        if output["logprobs"] is None:
            return ids, None
        return ids, [[lp[0] for lp in seq] for seq in output["logprobs"]]

    def load_weights(self) -> None:
        accelerator = self.trainer.accelerator
        accelerator.wait_for_everyone()  # every rank's generation is paused
        compat.sync_weights_if_stale(self.trainer, contextlib.nullcontext())
        accelerator.wait_for_everyone()  # the server holds the new weights before anyone resumes


class ColocatedGenerator:
    """The colocated vLLM engine, tensor parallel 1 (no collective in its generate)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.generation = trainer.vllm_generation

    def generate(
        self, contexts: list[list[int]], max_new_tokens: int, seeds: list[int] | None
    ) -> Completions:
        if seeds is not None:
            return compat.colocated_generate(
                self.generation, contexts, max_new_tokens, seeds, contextlib.nullcontext()
            )
        return compat.trl_vllm_generate(
            self.generation, contexts, max_new_tokens, 1, contextlib.nullcontext()
        )

    def load_weights(self) -> None:
        compat.sync_weights_if_stale(self.trainer, contextlib.nullcontext())


class SnapshotGenerator:
    """transformers generation from a copy of the policy (see the module docstring)."""

    def __init__(self, trainer: Any) -> None:
        if trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled:
            raise ValueError(
                "async_generation with transformers generation needs the whole policy on each "
                "rank (no DeepSpeed or FSDP sharding): generate with vLLM instead"
            )
        self.trainer = trainer
        self.device = trainer.accelerator.device
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.snapshot: torch.nn.Module | None = None
        self.score = trainer.args.max_staleness > 0  # staleness 0: nothing is ever stale
        self.private_rng = trainer.args.max_staleness > 0  # see _sample

    @torch.no_grad()
    def load_weights(self) -> None:
        from peft import PeftModel

        model = self.trainer.accelerator.unwrap_model(self.trainer.model_wrapped)
        if isinstance(model, PeftModel):
            fresh = compat.merged_copy(model)
            if self.snapshot is None:
                self.snapshot = fresh
            else:
                compat.refresh_in_place(self.snapshot, fresh)
        elif self.snapshot is None:
            self.snapshot = detached_copy(model)
        else:
            compat.refresh_in_place(self.snapshot, model)
        # the mode of the policy, as TRL's path generates from it, without gradient
        # checkpointing (TRL turns it off around generation; the copy never trains), so that
        # it decodes with a KV cache exactly as TRL does, token for token
        self.snapshot.train(model.training).requires_grad_(False)
        if getattr(self.snapshot, "is_gradient_checkpointing", False):
            self.snapshot.gradient_checkpointing_disable()
        if self.stream is not None:
            torch.cuda.current_stream(self.device).synchronize()

    def generate(
        self, contexts: list[list[int]], max_new_tokens: int, seeds: list[int] | None
    ) -> Completions:
        if not contexts:
            return [], []
        stream = torch.cuda.stream(self.stream) if self.stream is not None else None
        with stream or contextlib.nullcontext():
            ids = self._sample(contexts, max_new_tokens, None if seeds is None else seeds[0])
            logprobs = None
            if self.score:
                temperature = self.trainer.args.temperature
                logprobs = token_logprobs(self.snapshot, contexts, ids, temperature, self._pad())
        return ids, logprobs

    def _pad(self) -> int:
        return compat.tokenizer(self.trainer).pad_token_id

    def _sample(self, contexts: list[list[int]], max_new_tokens: int, seed: int | None) -> list:
        """TRL's transformers path (``_generate_single_turn``) on the snapshot: left-padded
        prompts, TRL's generation config, everything after the first end-of-turn dropped; one
        seed for the batch. With ``max_staleness: 0`` nothing else runs while it samples, and it
        samples under a forked global RNG exactly as ``compat.transformers_generate``; beyond,
        the update runs meanwhile, so it draws from a generator of its own
        (``private_sampling``) and never touches the global RNG state the update uses."""
        from trl.models.utils import unwrap_model_for_generation
        from trl.trainer.utils import pad

        trainer = self.trainer
        multiple = trainer.pad_to_multiple_of
        tensors = [torch.tensor(ids) for ids in contexts]
        input_ids = pad(tensors, self._pad(), padding_side="left", pad_to_multiple_of=multiple)
        mask = pad([torch.ones_like(t) for t in tensors], 0, "left", pad_to_multiple_of=multiple)
        config = copy.deepcopy(trainer.generation_config)
        config.max_new_tokens = max_new_tokens
        # compile_generation: the snapshot is kept across steps and refreshed in place, as
        # the synchronous path's generation copy is, so its compiled decode step stays valid
        for key, value in compat.compiled_decode(trainer.args, contexts, max_new_tokens).items():
            setattr(config, key, value)
        kwargs = {**trainer.generation_kwargs, "max_new_tokens": max_new_tokens}
        private = self.private_rng and seed is not None
        processors = private_sampling(config, seed, self.device) if private else None
        devices = [self.device] if self.device.type == "cuda" else []
        with (
            torch.random.fork_rng(devices=devices, enabled=seed is not None and not private),
            unwrap_model_for_generation(
                self.snapshot, trainer.accelerator, generation_kwargs=kwargs
            ) as model,
            torch.no_grad(),
        ):
            if seed is not None and not private:
                torch.manual_seed(seed)
            out = model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=mask.to(self.device),
                generation_config=config,
                logits_processor=processors,
            )
        completions = out[:, input_ids.size(1) :].cpu()
        eos = set(trainer.eos_token_ids)
        result = []
        for row in completions.tolist():
            end = next((i for i, token in enumerate(row) if token in eos), len(row) - 1)
            result.append(row[: end + 1])
        return result


UNSUPPORTED_WARPERS = ("top_h", "typical_p", "epsilon_cutoff", "eta_cutoff")


def private_sampling(config: Any, seed: int, device: torch.device) -> Any:
    """Logits processors that sample with a ``torch.Generator`` of their own, seeded with
    ``seed``: ``config``'s sampling warpers (temperature, top-k, top-p, min-p, in transformers'
    order), then one draw that leaves only the sampled token, which greedy decoding then picks.
    ``generate`` samples from the process-wide RNG and takes no generator; a rollout thread that
    seeds that RNG races the update's own draws. ``config`` is switched to greedy decoding."""
    from transformers import (
        LogitsProcessorList,
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    unsupported = [k for k in UNSUPPORTED_WARPERS if getattr(config, k, None) not in (None, 1.0)]
    if unsupported:
        raise ValueError(f"async_generation with transformers cannot sample with {unsupported}")
    warpers = []
    if config.temperature is not None and config.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(config.temperature))
    if config.top_k is not None and config.top_k != 0:
        warpers.append(TopKLogitsWarper(top_k=config.top_k))
    if config.top_p is not None and config.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=config.top_p))
    if config.min_p is not None:
        warpers.append(MinPLogitsWarper(min_p=config.min_p))
    config.do_sample = False
    config.temperature = config.top_k = config.top_p = config.min_p = None
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return LogitsProcessorList([*warpers, _Draw(generator)])


class _Draw:
    """The last logits processor of ``private_sampling``: one token per row from the
    softmax of the warped scores, drawn with its generator; every other token is ruled out."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(scores.float(), dim=-1)
        choice = torch.multinomial(probs, 1, generator=self.generator)
        return torch.full_like(scores, float("-inf")).scatter_(1, choice, 0.0)


@torch.no_grad()
def token_logprobs(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    temperature: float,
    pad_id: int,
    chunk: int = 8,
) -> list[list[float]]:
    """Log-probability of every completion token under ``model`` at ``temperature``, laid out
    as TRL's loss computes them (left-padded prompt, right-padded completion, logits divided by
    the temperature), so that the importance weight of a token the policy did not change is 1."""
    device = next(model.parameters()).device
    out: list[list[float]] = []
    for start in range(0, len(prompts), chunk):
        rows = range(start, min(start + chunk, len(prompts)))
        width_p = max(len(prompts[i]) for i in rows)
        width_c = max(max(len(completions[i]) for i in rows), 1)
        ids = torch.full((len(rows), width_p + width_c), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, i in enumerate(rows):
            p, c = list(prompts[i]), list(completions[i])
            ids[r, width_p - len(p) : width_p] = torch.tensor(p, dtype=torch.long)
            ids[r, width_p : width_p + len(c)] = torch.tensor(c, dtype=torch.long)
            mask[r, width_p - len(p) : width_p + len(c)] = 1
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
        logits = logits[:, width_p - 1 : -1].float() / temperature
        picked = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, width_p:, None].to(device))
        picked = picked.squeeze(-1).cpu()
        for r, i in enumerate(rows):
            out.append(picked[r, : len(completions[i])].tolist())
    return out
