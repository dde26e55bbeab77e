"""Keep a non-finite gradient out of the policy's weights.

bf16 training is not bit-reproducible, and once in a while one batch yields a NaN or inf
gradient. transformers' Trainer clips it (which spreads the NaN over every gradient) and steps
the optimizer anyway; the next generation then samples from NaN probabilities and the CUDA
context dies on a device-side assert, taking the whole run with it (a GRPO run of the learning
benchmark ended so at its 7th step). This callback drops such a step instead: every gradient
is cleared before ``optimizer.step()``, which then leaves the weights and the optimizer's
moments untouched, as ``torch.amp.GradScaler`` does for fp16. A run whose gradients stay
non-finite is broken, not unlucky, so it stops with an error after ``max_in_a_row`` such steps.

Data-parallel ranks see the same all-reduced gradients and so make the same decision. Under
DeepSpeed the engine owns the gradients and steps inside ``backward``, before any callback, so
the trainer does not install the guard there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from transformers import TrainerCallback

SKIPPED_METRIC = "optim/nonfinite_grad_skipped"


class NonFiniteGradientError(RuntimeError):
    """Training produced non-finite gradients step after step."""


def gradients_finite(parameters: Iterable[torch.nn.Parameter]) -> bool | None:
    """Whether every gradient is finite; None when no parameter has one."""
    flags = [torch.isfinite(p.grad).all() for p in parameters if p.grad is not None]
    if not flags:
        return None
    return bool(torch.stack(flags).all())


class NonFiniteGradientGuard(TrainerCallback):
    """Skips an optimizer step whose gradients are not all finite; see the module docstring."""

    def __init__(self, max_in_a_row: int, log_metric: Callable[[str, float], None]) -> None:
        if max_in_a_row < 1:
            raise ValueError(f"max_nonfinite_grad_steps must be >= 1, got {max_in_a_row}")
        self.max_in_a_row = max_in_a_row
        self.log_metric = log_metric
        self.in_a_row = 0

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model = kwargs["model"]
        finite = gradients_finite(model.parameters())
        if finite is None:
            return
        self.log_metric(SKIPPED_METRIC, 0.0 if finite else 1.0)
        if finite:
            self.in_a_row = 0
            return
        model.zero_grad(set_to_none=True)
        self.in_a_row += 1
        if self.in_a_row >= self.max_in_a_row:
            raise NonFiniteGradientError(
                f"{self.in_a_row} optimizer steps in a row had NaN or inf gradients (up to step "
                f"{state.global_step + 1}); their updates were skipped, so the weights are the "
                "last finite ones. Lower the learning rate or check the loss's inputs; "
                "max_nonfinite_grad_steps sets how many such steps in a row are tolerated."
            )
