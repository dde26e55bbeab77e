"""Every outcome of one turn as the EvalResult the environment returns for it, and its reward
under each preset: the source of the reward table in the README and of its property tests.

An outcome is what happened to a completion: it held no usable code (format error), it ran out
of tokens, its code failed to compile or to run, ran too long, was wrong, cheated, met a
failure of ours (harness error), or was correct, slower or faster than the baseline. A
completion cut at the token limit is not a status of its own: the environment parses what was
generated, and an unterminated code block is a syntax error, hence ``format_error``
(``kernelrl.env.parse``); a truncated text that still holds a complete ``ModelNew`` block is
judged like any other. The GPU outcomes carry a profile (``own_kernel_share``); on CPU no
timing is meaningful (the Triton interpreter emulates the GPU with numpy), so a correct CPU
result has no speedup term and the profiling term is the CPU fallback.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from kernelrl.env.result import EvalResult, Status
from kernelrl.rewards.components import total_reward
from kernelrl.rewards.config import REWARD_PRESETS, RewardConfig


def result(status: Status, **fields: object) -> EvalResult:
    return EvalResult(task_id="t", backend="triton", status=status, **fields)


def correct_gpu(speedup: float, share: float = 0.9) -> EvalResult:
    """A correct GPU result ``speedup`` times as fast as both baselines."""
    return result(
        Status.CORRECT,
        device="cuda",
        timing_meaningful=True,
        speedup_vs_eager=speedup,
        speedup_vs_compile=speedup,
        own_kernel_share=share,
        custom_kernel_launches=1,
    )


def correct_cpu() -> EvalResult:
    """A correct CPU (interpreter) result: launched its own kernel, no meaningful timing."""
    return result(Status.CORRECT, device="cpu", timing_meaningful=False, custom_kernel_launches=1)


#: The outcomes of the README's reward table, in its row order.
OUTCOMES: dict[str, Callable[[], EvalResult]] = {
    "format error": lambda: result(Status.FORMAT_ERROR),
    "token limit (truncated code block)": lambda: result(Status.FORMAT_ERROR),
    "compile error": lambda: result(Status.COMPILE_ERROR),
    "runtime error": lambda: result(Status.RUNTIME_ERROR),
    "timeout": lambda: result(Status.TIMEOUT),
    "incorrect": lambda: result(Status.INCORRECT),
    "integrity violation (1 check)": lambda: result(
        Status.INTEGRITY_VIOLATION, checks_failed=["torch_fallback"]
    ),
    "integrity violation (2 checks)": lambda: result(
        Status.INTEGRITY_VIOLATION, checks_failed=["torch_fallback", "no_custom_kernel"]
    ),
    "harness error (ours)": lambda: result(Status.HARNESS_ERROR),
    "correct, GPU, 0.5x (slow), share 0.9": lambda: correct_gpu(0.5),
    "correct, GPU, 1x, share 0.9": lambda: correct_gpu(1.0),
    "correct, GPU, 2x (fast), share 0.9": lambda: correct_gpu(2.0),
    "correct, GPU, 8x or more, share 1.0": lambda: correct_gpu(8.0, 1.0),
    "correct, CPU (interpreter: no timing)": correct_cpu,
}

#: Outcomes that make no attempt at a kernel (nothing was parsed).
NON_ATTEMPTS = (Status.FORMAT_ERROR,)
#: Honest failed attempts: parsed, no rule broken, not correct.
HONEST_FAILURES = (
    Status.COMPILE_ERROR,
    Status.RUNTIME_ERROR,
    Status.TIMEOUT,
    Status.INCORRECT,
    Status.NOT_RUN,
)


def preset_config(preset: str) -> RewardConfig:
    """The RewardConfig a training recipe gets for ``reward_preset`` with default keys."""
    return RewardConfig(reward_preset=preset)


def reward_table() -> dict[str, dict[str, float]]:
    """outcome -> preset -> total reward (NaN: no reward, the turn is left out of training)."""
    return {
        name: {preset: total_reward(make(), preset_config(preset)) for preset in REWARD_PRESETS}
        for name, make in OUTCOMES.items()
    }


def format_reward_value(value: float) -> str:
    """A table cell: two decimals, or "none" for an unscored outcome."""
    return "none" if math.isnan(value) else f"{value:.2f}"
