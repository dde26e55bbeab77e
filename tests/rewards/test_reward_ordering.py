"""The ordering of rewards the README's reward table claims, for every preset, checked
exhaustively over grids of outcomes (speedups, kernel-time shares, failed-check counts, devices,
baselines, the CPU profiling fallback). hypothesis is not installed in the venv, so the grids
are explicit; each property is stated as the README states it."""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest

from kernelrl.env.parse import FormatError, extract_solution
from kernelrl.env.result import EvalResult, Status
from kernelrl.rewards import REWARD_FUNCS, REWARD_PRESETS, RewardConfig, total_reward
from kernelrl.rewards.outcomes import (
    HONEST_FAILURES,
    NON_ATTEMPTS,
    OUTCOMES,
    correct_cpu,
    correct_gpu,
    format_reward_value,
    preset_config,
    result,
    reward_table,
)

README = Path(__file__).resolve().parents[2] / "README.md"

SPEEDUPS = (1e-3, 0.1, 0.5, 0.9, 1.0, 1.01, 1.5, 2.0, 3.0, 8.0, 100.0)
SHARES = (1e-3, 0.1, 0.5, 0.99, 1.0)


def configs() -> list[tuple[str, RewardConfig]]:
    """Every preset, with each of its user-settable knobs at both ends."""
    out = []
    for preset in REWARD_PRESETS:
        base = preset_config(preset)
        for baseline, fallback in itertools.product(("eager", "compile"), (0.0, 1.0)):
            out.append(
                (
                    f"{preset}-{baseline}-fallback{fallback}",
                    replace(base, speedup_baseline=baseline, profiling_cpu_fallback=fallback),
                )
            )
    return out


CONFIGS = configs()
IDS = [name for name, _ in CONFIGS]


def non_attempts() -> list[EvalResult]:
    return [result(s) for s in NON_ATTEMPTS]


def honest_failures() -> list[EvalResult]:
    failures = [result(s) for s in HONEST_FAILURES]
    # wrong answers measured on a GPU carry timings and a profile: none of it may count
    failures += [
        replace(correct_gpu(s, share), status=Status.INCORRECT)
        for s, share in itertools.product(SPEEDUPS, SHARES)
    ]
    return failures


def hacks() -> list[EvalResult]:
    # a hack that would have been fast and correct: its measurements must not count
    return [
        replace(
            correct_gpu(s, 1.0),
            status=Status.INTEGRITY_VIOLATION,
            checks_failed=[f"check{i}" for i in range(n)],
        )
        for s, n in itertools.product(SPEEDUPS, range(0, 4))
    ]


def corrects() -> list[EvalResult]:
    return [correct_gpu(s, share) for s, share in itertools.product(SPEEDUPS, SHARES)] + [
        correct_cpu()
    ]


def rewards(results: list[EvalResult], config: RewardConfig) -> list[float]:
    values = [total_reward(r, config) for r in results]
    assert not any(math.isnan(v) for v in values)
    return values


def test_every_preset_is_covered():
    assert {name.split("-")[0] for name in IDS} == set(REWARD_PRESETS)
    with pytest.raises(ValueError):
        preset_config("no_such_preset")


@pytest.mark.parametrize("config", [c for _, c in CONFIGS], ids=IDS)
def test_no_non_attempt_above_an_honest_failed_attempt(config):
    assert max(rewards(non_attempts(), config)) <= min(rewards(honest_failures(), config))


@pytest.mark.parametrize("config", [c for _, c in CONFIGS], ids=IDS)
def test_a_hack_never_above_an_honest_failure(config):
    honest = rewards(honest_failures() + non_attempts(), config)
    assert max(rewards(hacks(), config)) <= min(honest)


@pytest.mark.parametrize("config", [c for _, c in CONFIGS], ids=IDS)
def test_a_correct_kernel_above_every_failure(config):
    failures = honest_failures() + non_attempts() + hacks()
    assert min(rewards(corrects(), config)) > max(rewards(failures, config))


@pytest.mark.parametrize("config", [c for _, c in CONFIGS], ids=IDS)
def test_faster_never_scores_less_on_a_gpu(config):
    for share in SHARES:
        values = rewards([correct_gpu(s, share) for s in SPEEDUPS], config)
        assert values == sorted(values)
    assert total_reward(correct_gpu(2.0), config) > total_reward(correct_gpu(1.0), config)


def test_kernelrl_ties_a_wrong_answer_only_without_time_in_own_kernels():
    """The boundary of the strict ordering under ``kernelrl``: a correct kernel 2x (or more)
    slower than the baseline loses its correctness point to the clipped log2 speedup (-1), so
    with no GPU time in its own kernels it would tie an honest failure (0.1). A correct result
    always launched its own kernel (integrity checks), so its share is above 0."""
    config = preset_config("kernelrl")
    assert total_reward(correct_gpu(0.25, 0.0), config) == pytest.approx(
        total_reward(result(Status.INCORRECT), config)
    )


@pytest.mark.parametrize("config", [c for _, c in CONFIGS], ids=IDS)
def test_on_cpu_speed_earns_nothing(config):
    """Interpreter timings are not meaningful: a CPU result's reported speedup is ignored."""
    fast = replace(correct_cpu(), speedup_vs_eager=50.0, speedup_vs_compile=50.0)
    slow = replace(correct_cpu(), speedup_vs_eager=0.01, speedup_vs_compile=0.01)
    assert (
        total_reward(fast, config)
        == total_reward(slow, config)
        == total_reward(correct_cpu(), config)
    )


@pytest.mark.parametrize("config", [c for _, c in CONFIGS], ids=IDS)
def test_harness_error_gets_no_reward(config):
    assert math.isnan(total_reward(result(Status.HARNESS_ERROR), config))
    for func in REWARD_FUNCS.values():
        assert func(
            [], [""], eval_results=[result(Status.HARNESS_ERROR)], reward_config=config
        ) == [None]


def test_a_completion_cut_at_the_token_limit_is_a_format_error():
    whole = "Plan.\n```python\nimport torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n```\n"
    extract_solution(whole)  # complete: parsed
    for cut in (len(whole) // 3, whole.index("return"), whole.index("(self") + 3):
        with pytest.raises(FormatError):
            extract_solution(whole[:cut])


def test_readme_reward_table_is_the_computed_one():
    text = README.read_text()
    match = re.search(r"<!-- reward-table -->\n(.*?)\n<!-- /reward-table -->", text, re.S)
    assert match, "README has no reward table between <!-- reward-table --> markers"
    rows = [line for line in match.group(1).splitlines() if line.startswith("| ")][2:]
    cells = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]] for r in rows}
    table = reward_table()
    assert list(cells) == list(OUTCOMES)
    for outcome, values in table.items():
        assert cells[outcome] == [format_reward_value(values[p]) for p in REWARD_PRESETS], outcome
