"""A NaN gradient never reaches the weights: the step is skipped, logged, and a run that keeps
producing them stops with a clear error. On transformers' own Trainer loop (a one-parameter
model) and on KernelGRPOTrainer (a tiny Llama). Seconds on CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset
from transformers import Trainer, TrainerCallback, TrainingArguments

from kernelrl.rl.grad_guard import (
    SKIPPED_METRIC,
    NonFiniteGradientError,
    NonFiniteGradientGuard,
    gradients_finite,
)


class Line(torch.nn.Module):
    """Fits w * x = 1; a poisoned example makes the loss, and so every gradient, NaN."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([0.5]))

    def forward(self, x: torch.Tensor, poison: torch.Tensor) -> dict[str, torch.Tensor]:
        loss = ((self.w * x).sum() - 1.0) ** 2
        return {"loss": torch.where(poison.any(), torch.tensor(float("nan")), 1.0) * loss}


class Examples(Dataset):
    def __init__(self, poisoned: list[bool]) -> None:
        self.poisoned = poisoned

    def __len__(self) -> int:
        return len(self.poisoned)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": torch.tensor([1.0]), "poison": torch.tensor([self.poisoned[index]])}


def fit(tmp_path: Path, poisoned: list[bool], max_in_a_row: int) -> tuple[Line, list, Any]:
    model = Line()
    logged: list[tuple[str, float]] = []
    guard = NonFiniteGradientGuard(max_in_a_row, lambda name, value: logged.append((name, value)))
    args = TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        per_device_train_batch_size=1,
        max_steps=len(poisoned),
        learning_rate=0.1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Examples(poisoned), callbacks=[guard])
    return model, logged, trainer


def test_a_nan_step_is_skipped_and_the_others_train(tmp_path: Path) -> None:
    model, logged, trainer = fit(tmp_path, [False, True, False], max_in_a_row=2)
    trainer.train()
    assert torch.isfinite(model.w).all()
    assert model.w.item() != 0.5  # the two finite steps moved it
    assert sorted(value for _, value in logged) == [0.0, 0.0, 1.0]
    assert {name for name, _ in logged} == {SKIPPED_METRIC}


def test_nan_steps_in_a_row_stop_training_with_the_weights_untouched(tmp_path: Path) -> None:
    model, logged, trainer = fit(tmp_path, [True, True, True], max_in_a_row=2)
    with pytest.raises(NonFiniteGradientError, match="2 optimizer steps in a row"):
        trainer.train()
    assert model.w.item() == 0.5
    assert [value for _, value in logged] == [1.0, 1.0]


def test_gradients_finite() -> None:
    a, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    assert gradients_finite([a, b]) is None
    a.grad = torch.ones(2)
    assert gradients_finite([a, b]) is True
    b.grad = torch.tensor([1.0, float("inf")])
    assert gradients_finite([a, b]) is False
    with pytest.raises(ValueError, match="max_nonfinite_grad_steps"):
        NonFiniteGradientGuard(0, lambda *_: None)


class Snapshots(TrainerCallback):
    def __init__(self) -> None:
        self.after_step: dict[int, dict[str, torch.Tensor]] = {}

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        weights = {n: p.detach().clone() for n, p in kwargs["model"].named_parameters()}
        self.after_step[state.global_step] = weights


def test_the_rl_trainer_skips_a_nan_step(tmp_path: Path) -> None:
    from rl_support import VerdictPool, tiny_trainer

    from kernelrl.env.result import Status

    run = tiny_trainer(
        tmp_path,
        VerdictPool(lambda task, solution, call: [Status.INCORRECT, Status.CORRECT][call % 2]),
        rows=2,
        max_steps=2,
        max_completion_length=8,
        learning_rate=1e-2,
        beta=0.0,
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        rejection_sampling=False,
        max_nonfinite_grad_steps=2,
    )
    snapshots = Snapshots()
    run.add_callback(snapshots)
    before = {n: p.detach().clone() for n, p in run.model.named_parameters()}
    poisoned = next(p for p in run.model.parameters() if p.requires_grad)
    poisoned.register_hook(lambda grad: grad * float("nan") if run.state.global_step == 0 else grad)
    run.train()
    first = snapshots.after_step[1]
    assert all(torch.equal(first[n], before[n]) for n in before)  # step 1 was skipped
    assert all(torch.isfinite(p).all() for p in run.model.parameters())
    logged = {e["step"]: e[SKIPPED_METRIC] for e in run.state.log_history if SKIPPED_METRIC in e}
    assert logged == {1: 1.0, 2: 0.0}
