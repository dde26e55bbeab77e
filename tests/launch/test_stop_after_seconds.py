"""``stop_after_s``: a time-limited training job ends at a step boundary with a checkpoint, which a
rerun resumes from, instead of being killed mid-step."""

from __future__ import annotations

from pathlib import Path

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
