"""``stop_after_s``: a time-limited training job ends at a step boundary with a checkpoint, which a
rerun resumes from, instead of being killed mid-step."""

from __future__ import annotations

import multiprocessing
import os
import socket
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from transformers import Trainer, TrainingArguments

from kernelrl.launch.train_progress import StopAfterSeconds, train_callbacks


class _Regression(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(4))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": ((x @ self.weight - y) ** 2).mean()}


class _Rows(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        x = torch.arange(4, dtype=torch.float32) + index
        return {"x": x, "y": x.sum()}


def _train(tmp_path: Path, seconds: float) -> Trainer:
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=20,
        per_device_train_batch_size=2,
        save_strategy="steps",
        save_steps=100,  # never on schedule: a checkpoint before the last step is the stop's
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=_Regression(),
        args=args,
        train_dataset=_Rows(),
        callbacks=[StopAfterSeconds(seconds)],
    )
    trainer.train()
    return trainer


def test_training_stops_after_the_first_step_past_the_limit_with_a_checkpoint(
    tmp_path: Path,
) -> None:
    trainer = _train(tmp_path, seconds=0.0)
    assert trainer.state.global_step == 1
    assert [p.name for p in tmp_path.glob("checkpoint-*")] == ["checkpoint-1"]


def test_training_runs_to_max_steps_within_the_limit(tmp_path: Path) -> None:
    trainer = _train(tmp_path, seconds=3600.0)
    assert trainer.state.global_step == 20
    assert [p.name for p in tmp_path.glob("checkpoint-*")] == ["checkpoint-20"]  # the final one


def test_the_stop_is_added_only_when_asked_for() -> None:
    console = Console(file=None, force_terminal=False)
    assert not any(isinstance(c, StopAfterSeconds) for c in train_callbacks(console))
    assert any(isinstance(c, StopAfterSeconds) for c in train_callbacks(console, 60.0))


def _train_rank(rank: int, port: int, folder: str, results: Any) -> None:
    """One of two DDP processes (gloo); only rank 0's clock is past the limit."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
        WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
    )  # fmt: skip
    args = TrainingArguments(
        output_dir=folder,
        max_steps=20,
        per_device_train_batch_size=2,
        save_strategy="steps",
        save_steps=100,
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        disable_tqdm=True,
    )
    seconds = 0.0 if rank == 0 else 3600.0
    trainer = Trainer(
        model=_Regression(), args=args, train_dataset=_Rows(), callbacks=[StopAfterSeconds(seconds)]
    )
    trainer.train()
    results.put((rank, trainer.state.global_step))


def test_ranks_stop_at_the_same_step_when_only_one_clock_is_past_the_limit(
    tmp_path: Path,
) -> None:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ranks = [
        context.Process(target=_train_rank, args=(rank, port, str(tmp_path), results))
        for rank in (0, 1)
    ]
    for process in ranks:
        process.start()
    try:
        steps = dict(results.get(timeout=120) for _ in ranks)
    finally:
        for process in ranks:
            process.join(timeout=30)
            if process.is_alive():  # a rank that went on alone waits for the other forever
                process.kill()
    assert steps == {0: 1, 1: 1}
    assert [p.name for p in tmp_path.glob("checkpoint-*")] == ["checkpoint-1"]
