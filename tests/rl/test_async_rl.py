"""Asynchronous RL (``async_generation``) on a tiny random model with transformers generation:
with ``max_staleness: 0`` it is the synchronous trainer (same samples, same update); with more,
every trained sample's staleness is recorded on it and its turns and stays within the bound,
groups still waiting on the environment carry over, and stale tokens are importance-weighted.
Seconds on CPU."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import torch
from rl_support import result, task_rows, tiny_model, two_turn_config

from kernelrl.env.result import Status
from kernelrl.rl.config import KernelGRPOConfig
from kernelrl.rl.trainer import KernelGRPOTrainer

STATUSES = [Status.INCORRECT, Status.COMPILE_ERROR, Status.FORMAT_ERROR, Status.RUNTIME_ERROR]


class DelayedPool:
    """The pool contract with verdicts that arrive ``delay(task_id)`` seconds after submission
    (an evaluation that takes that long), each a function of the solution's text."""

    def __init__(self, delay: Callable[[str], float] = lambda task_id: 0.0) -> None:
        self.delay = delay
        self.timers: list[threading.Timer] = []

    def submit(self, tasks: Any, solutions: Any) -> list[Future]:
        futures = []
        for task, solution in zip(tasks, solutions, strict=True):
            future: Future = Future()
            verdict = result(task, STATUSES[len(solution) % len(STATUSES)])
            timer = threading.Timer(self.delay(task.id), future.set_result, (verdict,))
            timer.start()
            self.timers.append(timer)
            futures.append(future)
        return futures

    def close(self) -> None:
        for timer in self.timers:
            timer.join()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_model(tmp_path_factory.mktemp("tiny"))


def config(output_dir: Path, **overrides: Any) -> KernelGRPOConfig:
    return two_turn_config(
        output_dir,
        **{"max_steps": 3, "vllm_importance_sampling_mode": "token_truncate", **overrides},
    )


class Recording(KernelGRPOTrainer):
    """Keeps what each step trained on (a view for the test, no behaviour change)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.steps: list[dict[str, Any]] = []

    def _apply_advantages(self, output: dict[str, Any], flight: Any, mode: str) -> None:
        super()._apply_advantages(output, flight, mode)
        self.steps.append(
            {
                "step": self.state.global_step,
                "ids": [row["id"] for row in flight.inputs],
                "trajectories": flight.rollout.trajectories,
                "advantages": output["advantages"].clone(),
            }
        )


def rows() -> list[dict[str, Any]]:
    """Four prompts (two bundled tasks, twice): one group a step, four steps in an epoch."""
    first = task_rows(2)
    return first + [{**row, "id": f"{row['id']}_again"} for row in first]


def train(
    model_dir: str,
    args: KernelGRPOConfig,
    pool: DelayedPool,
    kind: type = Recording,
    peft_config: Any = None,
    data: list[dict[str, Any]] | None = None,
) -> Recording:
    from transformers import AutoTokenizer

    from kernelrl.data.schema import make_dataset

    run = kind(
        model=model_dir,
        args=args,
        train_dataset=make_dataset(rows() if data is None else data, "tasks"),
        processing_class=AutoTokenizer.from_pretrained(model_dir, padding_side="left"),
        pool=pool,
        peft_config=peft_config,
    )
    try:
        run.train()
    finally:
        run.close()
    return run


def logs(run: KernelGRPOTrainer) -> dict[int, dict]:
    return {e["step"]: e for e in run.state.log_history if "reward" in e}


@pytest.mark.parametrize("compiled", [False, True])
def test_staleness_zero_is_the_synchronous_trainer(
    model_dir: str, tmp_path: Path, compiled: bool
) -> None:
    """Also with ``compile_generation`` (on a CPU its static KV cache, which transformers does
    not compile there): the snapshot generates with the synchronous copy's settings."""
    sync = train(model_dir, config(tmp_path / "sync", compile_generation=compiled), DelayedPool())
    asynchronous = train(
        model_dir,
        config(
            tmp_path / "async",
            async_generation=True,
            max_staleness=0,
            compile_generation=compiled,
        ),
        DelayedPool(lambda task_id: 0.05),
    )
    assert len(sync.steps) == len(asynchronous.steps) == 3
    for one, other in zip(sync.steps, asynchronous.steps, strict=True):
        assert one["ids"] == other["ids"]
        assert [t.completion_ids for t in one["trajectories"]] == [
            t.completion_ids for t in other["trajectories"]
        ]
        assert torch.equal(one["advantages"], other["advantages"])
        assert all(t.policy_step == other["step"] for t in other["trajectories"])
    for (name, a), (_, b) in zip(
        sync.model.named_parameters(), asynchronous.model.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name
    assert all(e["async/staleness_max"] == 0 for e in logs(asynchronous).values())


@pytest.mark.parametrize("max_staleness", [1, 2])
def test_staleness_is_recorded_and_bounded(
    model_dir: str, tmp_path: Path, max_staleness: int
) -> None:
    run = train(
        model_dir,
        config(tmp_path, async_generation=True, max_staleness=max_staleness, max_steps=4),
        DelayedPool(lambda task_id: 0.02),
    )
    ages = []
    for step in run.steps:
        for trajectory in step["trajectories"]:
            turns = [turn.policy_step for turn in trajectory.turns]
            assert trajectory.policy_step == min(turns)  # the oldest weights that wrote it
            assert max(turns) <= step["step"]
            ages.append(step["step"] - trajectory.policy_step)
            scored = [
                lp for lp, m in zip(trajectory.logprobs, trajectory.env_mask, strict=True) if m
            ]
            assert all(isinstance(lp, float) for lp in scored)  # behaviour log-probabilities
    assert max(ages) <= max_staleness
    assert max(ages) >= 1  # generation ran ahead of the update
    entries = logs(run)
    assert max(e["async/staleness_max"] for e in entries.values()) == max(ages)
    weights = [e["async/importance_weight_mean"] for e in entries.values()]
    assert all(0.0 < w <= 3.0 for w in weights)


def test_a_group_waiting_on_the_environment_carries_over(model_dir: str, tmp_path: Path) -> None:
    slow = "01_relu"  # the first batch: its verdicts take long, the second batch's do not
    run = train(
        model_dir,
        config(tmp_path, async_generation=True, max_staleness=1, max_steps=2),
        DelayedPool(lambda task_id: 3.0 if task_id == slow else 0.0),
    )
    trained = [step["ids"][0] for step in run.steps]
    assert trained == ["06_row_sum", "01_relu"]  # the complete group first; the slow one next
    entries = logs(run)
    assert entries[1]["async/carried_groups"] >= 1
    # carried over one step: generated by the initial weights, trained by step 1's update
    assert [t.policy_step for t in run.steps[1]["trajectories"]] == [0, 0]


def test_generation_runs_ahead_across_an_epochs_end(model_dir: str, tmp_path: Path) -> None:
    """Two prompts, one a step: every other step starts an epoch. Its batch is generated while
    the step before trains (staleness 1), and the data order is the synchronous run's."""
    data = task_rows(2)
    sync = train(model_dir, config(tmp_path / "sync", max_steps=4), DelayedPool(), data=data)
    run = train(
        model_dir,
        config(tmp_path / "async", async_generation=True, max_staleness=1, max_steps=4),
        DelayedPool(lambda task_id: 0.02),
        data=data,
    )
    assert [s["ids"] for s in run.steps] == [s["ids"] for s in sync.steps]
    first_of_epoch = run.steps[2]
    assert [first_of_epoch["step"] - t.policy_step for t in first_of_epoch["trajectories"]] == [
        1,
        1,
    ]


class ThreadRecording(Recording):
    """Records the thread of every generation call."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.generation_threads: list[int] = []
        generator = self.asynchronous.engine.generator
        generate = generator.generate

        def recorded(*call: Any) -> Any:
            self.generation_threads.append(threading.get_ident())
            return generate(*call)

        generator.generate = recorded


def test_every_generation_call_runs_on_one_thread(model_dir: str, tmp_path: Path) -> None:
    """Whichever batch's rollout thread asks, generation runs on the one generation thread:
    CUDA graphs of a compiled decode step are kept per thread, and a thread per batch would
    record them again at every step."""
    run = train(
        model_dir,
        config(tmp_path, async_generation=True, max_staleness=2, max_steps=4),
        DelayedPool(lambda task_id: 0.02),
        ThreadRecording,
    )
    assert len(run.generation_threads) >= 8  # 4 batches of two turns, at least
    assert len(set(run.generation_threads)) == 1
    assert run.generation_threads[0] != threading.get_ident()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"overlap_evaluation": True}, "remove overlap_evaluation"),
        ({"num_iterations": 2}, "num_iterations: 1"),
        ({"steps_per_generation": 2}, "steps_per_generation"),
        ({"max_staleness": -1}, "max_staleness must be >= 0"),
        (
            {"use_vllm": True, "vllm_importance_sampling_correction": False},
            "importance-sampling correction",
        ),
    ],
)
def test_what_async_cannot_honour_is_refused(
    tmp_path: Path, overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        config(tmp_path, async_generation=True, **overrides)


def test_async_is_refused_where_kernels_are_timed_on_the_policys_gpus(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="async_generation would time kernels"):
        config(tmp_path, async_generation=True, env_pool="local", env_device="cuda")


class DrawingRecording(Recording):
    """The update draws from the global RNG while the next batches generate, as dropout does."""

    def _apply_advantages(self, output: dict[str, Any], flight: Any, mode: str) -> None:
        super()._apply_advantages(output, flight, mode)
        for _ in range(200):
            torch.rand(64)


def test_staleness_one_is_reproducible_run_to_run(model_dir: str, tmp_path: Path) -> None:
    """Rollout threads sample from generators of their own, so neither the update's use of the
    global RNG nor the threads' timing changes what they sample."""
    runs = []
    for name in ("one", "two"):
        args = config(tmp_path / name, async_generation=True, max_staleness=1)
        runs.append(train(model_dir, args, DelayedPool(lambda task_id: 0.02), DrawingRecording))
    one, two = runs
    assert [[t.completion_ids for t in s["trajectories"]] for s in one.steps] == [
        [t.completion_ids for t in s["trajectories"]] for s in two.steps
    ]
    for (name, a), (_, b) in zip(
        one.model.named_parameters(), two.model.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name


@pytest.mark.gpu
@pytest.mark.parametrize(("lora", "compiled"), [(False, False), (True, False), (True, True)])
def test_staleness_one_on_a_gpu(model_dir: str, tmp_path: Path, lora: bool, compiled: bool) -> None:
    """bf16 on CUDA (accelerate's autocast wrapper on the policy's forward, the copy on its own
    stream, per-batch CUDA generators), with and without LoRA (the merged copy), and with the
    compiled decode step (``compile_generation``) on the snapshot, refreshed in place."""
    from peft import LoraConfig

    peft = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear") if lora else None
    # The verdicts come from DelayedPool, nothing timed on this GPU: the recipe says so, as
    # async_generation refuses a local pool timing kernels on the policy's own GPU.
    args = config(
        tmp_path,
        async_generation=True,
        max_staleness=1,
        max_steps=3,
        use_cpu=False,
        bf16=True,
        env_device="cpu",
        compile_generation=compiled,
    )
    run = train(model_dir, args, DelayedPool(lambda task_id: 0.02), peft_config=peft)
    ages = [s["step"] - t.policy_step for s in run.steps for t in s["trajectories"]]
    assert max(ages) == 1
    generator = run.asynchronous.engine.generator
    assert next(generator.snapshot.parameters()).is_cuda
    assert hasattr(generator.snapshot, "_compiled_call") is compiled  # the decode step compiled
    weights = [e["async/importance_weight_mean"] for e in logs(run).values()]
    assert all(0.0 < w <= 3.0 for w in weights)
