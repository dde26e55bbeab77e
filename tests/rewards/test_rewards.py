"""Reward components over hand-built EvalResults (no kernel runs here)."""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path

import pytest

from kernelrl.env.gpu_claim import SHARED_WITH_KEY, SHARING_UNKNOWN_KEY
from kernelrl.env.result import EvalResult, Status
from kernelrl.rewards import (
    REGISTRY,
    REWARD_FUNCS,
    RewardConfig,
    build_reward_funcs,
    drkernel_reward_config,
    reward_components,
    rewarded,
    speed_unjudged,
    total_reward,
)

COMPONENT_NAMES = tuple(REGISTRY)
format_reward = REWARD_FUNCS["format_reward"]
correctness_reward = REWARD_FUNCS["correctness_reward"]
speedup_reward = REWARD_FUNCS["speedup_reward"]
profiling_reward = REWARD_FUNCS["profiling_reward"]
integrity_penalty = REWARD_FUNCS["integrity_penalty"]


def result(status: Status, backend: str = "triton", **fields) -> EvalResult:
    return EvalResult(task_id="t", backend=backend, status=status, **fields)


def gpu_correct(
    speedup_eager: float | None = 2.0, speedup_compile: float | None = 1.0, share: float = 0.75
):
    return result(
        Status.CORRECT,
        device="cuda",
        timing_meaningful=True,
        speedup_vs_eager=speedup_eager,
        speedup_vs_compile=speedup_compile,
        own_kernel_share=share,
        custom_kernel_launches=2,
    )


def cpu_correct(launches: int | None = 1) -> EvalResult:
    # What the evaluator writes on CPU: no timings that count, no profile.
    return result(
        Status.CORRECT, device="cpu", timing_meaningful=False, custom_kernel_launches=launches
    )


def component(name: str, r: EvalResult, config: RewardConfig | None = None) -> float:
    return reward_components(r, config)[name]


@pytest.mark.parametrize("status", [s for s in Status if s is not Status.HARNESS_ERROR])
def test_format_and_correctness_by_status(status: Status) -> None:
    r = result(status)
    assert component("format_reward", r) == (0.0 if status is Status.FORMAT_ERROR else 1.0)
    # not_run (CUDA C++ without a GPU) is never taken for correct.
    assert component("correctness_reward", r) == (1.0 if status is Status.CORRECT else 0.0)


def test_status_as_a_plain_string_is_refused_and_read_back_as_a_status() -> None:
    with pytest.raises(TypeError, match="must be a Status"):
        result("correct", custom_kernel_launches=1)  # type: ignore[arg-type]
    stored = result(Status.CORRECT, custom_kernel_launches=1).to_dict()
    assert stored["status"] == "correct"  # JSON holds the string ...
    assert EvalResult.from_dict(stored).status is Status.CORRECT  # ... read back as a Status
    assert component("correctness_reward", EvalResult.from_dict(stored)) == 1.0


def test_speedup_log2_and_baseline() -> None:
    r = gpu_correct(speedup_eager=4.0, speedup_compile=0.5)
    assert component("speedup_reward", r) == pytest.approx(2.0)  # log2(4)
    compile_cfg = RewardConfig(speedup_baseline="compile")
    assert component("speedup_reward", r, compile_cfg) == pytest.approx(-1.0)  # log2(0.5)
    assert component("speedup_reward", gpu_correct(speedup_eager=1.5)) == pytest.approx(
        math.log2(1.5)
    )


def test_speedup_clipped() -> None:
    assert component("speedup_reward", gpu_correct(speedup_eager=64.0)) == 3.0  # log2 = 6 -> max 3
    assert component("speedup_reward", gpu_correct(speedup_eager=0.1)) == -1.0  # -3.32 -> min -1
    narrow = RewardConfig(speedup_clip_min=-0.5, speedup_clip_max=1.0)
    assert component("speedup_reward", gpu_correct(speedup_eager=4.0), narrow) == 1.0
    assert component("speedup_reward", gpu_correct(speedup_eager=0.5), narrow) == -0.5
    assert component("speedup_reward", gpu_correct(speedup_eager=float("inf"))) == 3.0


def test_speedup_zero_without_a_meaningful_measurement() -> None:
    incorrect = result(Status.INCORRECT, timing_meaningful=True, speedup_vs_eager=10.0)
    assert component("speedup_reward", incorrect) == 0.0
    cpu = result(Status.CORRECT, timing_meaningful=False, speedup_vs_eager=10.0)
    assert component("speedup_reward", cpu) == 0.0
    no_compile = gpu_correct(speedup_eager=4.0, speedup_compile=None)
    assert component("speedup_reward", no_compile, RewardConfig(speedup_baseline="compile")) == 0.0
    assert component("speedup_reward", cpu_correct()) == 0.0


def test_profiling_reward_gpu_share() -> None:
    assert component("profiling_reward", gpu_correct(share=0.8)) == pytest.approx(0.8)
    assert component("profiling_reward", gpu_correct(share=0.0)) == 0.0
    lazy_but_incorrect = result(Status.INCORRECT, own_kernel_share=0.9, custom_kernel_launches=1)
    assert component("profiling_reward", lazy_but_incorrect) == 0.0
    cheat = result(Status.INTEGRITY_VIOLATION, own_kernel_share=1.0, checks_failed=["side_stream"])
    assert component("profiling_reward", cheat) == 0.0


def test_profiling_reward_cpu_fallback() -> None:
    assert component("profiling_reward", cpu_correct(launches=2)) == 1.0
    assert component("profiling_reward", cpu_correct(launches=0)) == 0.0
    assert component("profiling_reward", cpu_correct(launches=None)) == 0.0
    assert (
        component("profiling_reward", cpu_correct(), RewardConfig(profiling_cpu_fallback=0.5))
        == 0.5
    )
    assert (
        component("profiling_reward", cpu_correct(), RewardConfig(profiling_cpu_fallback=0.0))
        == 0.0
    )
    # CUDA C++ on a CPU machine: not run, so nothing to reward.
    assert component("profiling_reward", result(Status.NOT_RUN, backend="cuda")) == 0.0


def test_integrity_penalty_per_failed_check() -> None:
    two = result(Status.INTEGRITY_VIOLATION, checks_failed=["torch_fallback", "no_kernel_launched"])
    assert component("integrity_penalty", two) == -2.0
    three = result(Status.INTEGRITY_VIOLATION, checks_failed=["a", "b", "c"])
    assert (
        component("integrity_penalty", three, RewardConfig(integrity_penalty_per_check=0.5)) == -1.5
    )
    unnamed = result(Status.INTEGRITY_VIOLATION)
    assert component("integrity_penalty", unnamed) == -1.0
    for status in Status:
        if status not in (Status.INTEGRITY_VIOLATION, Status.HARNESS_ERROR):  # that one: NaN
            assert component("integrity_penalty", result(status, checks_failed=["x"])) == 0.0


def test_total_reward_hand_computed() -> None:
    config = RewardConfig()  # weights 0.1, 1, 1, 0.5, 1
    # format 1, correct 1, log2(2) = 1, share 0.75, no penalty:
    # 0.1 * 1 + 1 * 1 + 1 * 1 + 0.5 * 0.75 + 0 = 2.475
    assert total_reward(gpu_correct(speedup_eager=2.0, share=0.75), config) == pytest.approx(2.475)
    # format 1 and two failed checks: 0.1 - 2 = -1.9
    cheat = result(Status.INTEGRITY_VIOLATION, checks_failed=["a", "b"])
    assert total_reward(cheat, config) == pytest.approx(-1.9)
    assert total_reward(result(Status.INCORRECT), config) == pytest.approx(0.1)
    assert total_reward(result(Status.FORMAT_ERROR), config) == 0.0
    # CPU correct: 0.1 + 1 + 0 + 0.5 * 1 (fallback) = 1.6
    assert total_reward(cpu_correct(), config) == pytest.approx(1.6)
    custom = RewardConfig(
        format_weight=0.0, correctness_weight=2.0, speedup_weight=0.5, profiling_weight=0.0
    )
    # 2 * 1 + 0.5 * log2(8) = 3.5
    assert total_reward(gpu_correct(speedup_eager=8.0), custom) == pytest.approx(3.5)


def test_default_ordering_correct_beats_incorrect_beats_cheating() -> None:
    slowest_correct = gpu_correct(speedup_eager=1e-3, share=0.0)
    incorrect = result(Status.INCORRECT)
    cheat = result(Status.INTEGRITY_VIOLATION, checks_failed=["side_stream"])
    assert total_reward(slowest_correct) >= total_reward(incorrect) > total_reward(cheat)


def test_components_accept_dict_form() -> None:
    r = gpu_correct(speedup_eager=4.0)
    assert reward_components(r.to_dict()) == reward_components(r)
    assert reward_components(EvalResult.from_dict(r.to_dict())) == reward_components(r)
    with pytest.raises(TypeError):
        reward_components("correct")  # type: ignore[arg-type]


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="speedup_baseline"):
        RewardConfig(speedup_baseline="cuda_graphs")
    with pytest.raises(ValueError, match="speedup_clip_min"):
        RewardConfig(speedup_clip_min=2.0, speedup_clip_max=1.0)
    with pytest.raises(ValueError):
        RewardConfig(integrity_penalty_per_check=-1.0)
    with pytest.raises(ValueError):
        RewardConfig(profiling_cpu_fallback=2.0)


# --------------------------------------------------------------------------- TRL functions
BATCH = [
    gpu_correct(speedup_eager=4.0, speedup_compile=0.5, share=0.6),
    result(Status.FORMAT_ERROR),
    result(Status.INTEGRITY_VIOLATION, checks_failed=["a", "b"]),
    cpu_correct(),
]
PROMPTS = ["p"] * len(BATCH)
COMPLETIONS = ["c0", "c1", "c2", "c3"]


def test_trl_functions_batch() -> None:
    kwargs = {"eval_results": BATCH, "completion_ids": [[1]] * 4, "trainer_state": None}
    assert format_reward(PROMPTS, COMPLETIONS, **kwargs) == [1.0, 0.0, 1.0, 1.0]
    assert correctness_reward(PROMPTS, COMPLETIONS, **kwargs) == [1.0, 0.0, 0.0, 1.0]
    assert speedup_reward(PROMPTS, COMPLETIONS, **kwargs) == pytest.approx([2.0, 0.0, 0.0, 0.0])
    assert profiling_reward(PROMPTS, COMPLETIONS, **kwargs) == pytest.approx([0.6, 0.0, 0.0, 1.0])
    assert integrity_penalty(PROMPTS, COMPLETIONS, **kwargs) == [0.0, 0.0, -2.0, 0.0]
    compile_cfg = RewardConfig(speedup_baseline="compile")
    assert speedup_reward(PROMPTS, COMPLETIONS, reward_config=compile_cfg, **kwargs)[
        0
    ] == pytest.approx(-1.0)


def test_trl_functions_need_aligned_eval_results() -> None:
    with pytest.raises(KeyError, match="eval_results"):
        format_reward(PROMPTS, COMPLETIONS)
    with pytest.raises(ValueError, match="aligned"):
        format_reward(PROMPTS, COMPLETIONS, eval_results=BATCH[:3])


def test_trl_functions_none_for_unevaluated() -> None:
    results = [BATCH[0], None, BATCH[0].to_dict()]
    assert correctness_reward(["p"] * 3, ["a", "b", "c"], eval_results=results) == [1.0, None, 1.0]


def harness_error(**fields) -> EvalResult:
    # Fields that would score if the status were believed: they must not leak into a reward.
    return result(
        Status.HARNESS_ERROR,
        error="the harness could not serialise the outputs",
        speedup_vs_eager=4.0,
        own_kernel_share=0.9,
        custom_kernel_launches=3,
        timing_meaningful=True,
        **fields,
    )


def test_harness_error_has_no_reward_not_zero() -> None:
    r = harness_error()
    assert not r.scored
    components = reward_components(r)
    assert list(components) == list(COMPONENT_NAMES)
    assert all(math.isnan(v) for v in components.values())
    assert math.isnan(total_reward(r))
    assert math.isnan(total_reward(r.to_dict()))  # the dict form that crossed a process


def test_trl_functions_none_for_harness_error() -> None:
    """Every component returns None for it, so TRL sees a completion for which *all* reward
    functions returned None: unscorable (NaN reward, out of the group baseline, advantage 0)."""
    results = [BATCH[0], harness_error(), harness_error().to_dict(), BATCH[2]]
    funcs, _ = build_reward_funcs()
    for func in funcs:
        values = func(["p"] * 4, ["a", "b", "c", "d"], eval_results=results)
        assert values[1] is None and values[2] is None, func.__name__
        assert values[0] is not None and values[3] is not None, func.__name__
    assert correctness_reward(["p"] * 4, ["a"] * 4, eval_results=results) == [1.0, None, None, 0.0]
    assert integrity_penalty(["p"] * 4, ["a"] * 4, eval_results=results) == [0.0, None, None, -2.0]


@pytest.mark.parametrize(
    "why",
    [
        {SHARING_UNKNOWN_KEY: "the GPU was not found quiet within 2 s of pausing the sandboxes"},
        {SHARED_WITH_KEY: [4242]},
    ],
)
def test_a_correct_result_whose_timing_was_left_unused_gets_no_reward(why: dict) -> None:
    """The GPU kept busy through the check before the timing (which the measured solution can
    do itself) or shared with another evaluator: no reward, so a slow kernel cannot trade its
    own speed-up term for a 0 that ranks above it."""
    unjudged = result(Status.CORRECT, device="cuda", own_kernel_share=0.9, sandbox=dict(why))
    assert not unjudged.timing_meaningful  # as the evaluator leaves it then
    slow = gpu_correct(speedup_eager=0.25)
    assert speed_unjudged(unjudged) and not rewarded(unjudged) and unjudged.scored
    assert all(math.isnan(v) for v in reward_components(unjudged).values())
    assert math.isnan(total_reward(unjudged)) and math.isnan(total_reward(unjudged.to_dict()))
    assert math.isnan(total_reward(unjudged, drkernel_reward_config()))
    assert total_reward(slow) < total_reward(gpu_correct(speedup_eager=1.0))
    funcs, _ = build_reward_funcs()
    for func in funcs:
        assert func(["p"] * 2, ["a", "b"], eval_results=[unjudged, slow])[0] is None
    # A verdict against the solution stays its own, whatever the GPU was doing.
    incorrect = result(Status.INCORRECT, device="cuda", sandbox=dict(why))
    assert rewarded(incorrect) and component("correctness_reward", incorrect) == 0.0


@pytest.mark.parametrize("speedup", [None, float("nan")])
def test_a_correct_gpu_result_without_its_eager_speedup_gets_no_reward(speedup) -> None:
    """Timed, but no eager speed-up (an interleaved reference that got no turn: the solution
    reported no input set timed): unrewarded as well; on a CPU, where nothing is timed, the
    speed-up term is 0 as ever."""
    missing = gpu_correct(speedup_eager=speedup)
    assert speed_unjudged(missing) and math.isnan(total_reward(missing))
    assert not speed_unjudged(cpu_correct()) and component("speedup_reward", cpu_correct()) == 0.0
    compile_off = gpu_correct(speedup_eager=0.25, speedup_compile=None)  # its timing switched off
    assert rewarded(compile_off) and total_reward(compile_off) < total_reward(gpu_correct())


def test_build_reward_funcs_names_weights_and_binding() -> None:
    config = RewardConfig(speedup_baseline="compile", profiling_weight=0.25, format_weight=0.0)
    funcs, weights = build_reward_funcs(config)
    assert [f.__name__ for f in funcs] == list(COMPONENT_NAMES)
    assert weights == [0.0, 1.0, 1.0, 0.25, 1.0]
    by_name = {f.__name__: f for f in funcs}
    assert by_name["speedup_reward"](PROMPTS, COMPLETIONS, eval_results=BATCH)[0] == pytest.approx(
        -1.0
    )
    # Picklable (TRL may ship reward functions to other processes), config kept.
    clone = pickle.loads(pickle.dumps(by_name["speedup_reward"]))
    assert clone.__name__ == "speedup_reward"
    assert clone(PROMPTS, COMPLETIONS, eval_results=BATCH)[0] == pytest.approx(-1.0)
    # Summing the weighted TRL outputs gives total_reward for every sample.
    per_func = [f(PROMPTS, COMPLETIONS, eval_results=BATCH) for f in funcs]
    for i, r in enumerate(BATCH):
        weighted = sum(w * out[i] for w, out in zip(weights, per_func, strict=True))
        assert weighted == pytest.approx(total_reward(r, config))


def test_trl_reads_component_names_and_parses_config() -> None:
    from trl import TrlParser
    from trl.trainer.utils import get_callable_name

    funcs, _ = build_reward_funcs()
    assert [get_callable_name(f) for f in funcs] == list(COMPONENT_NAMES)
    (config,) = TrlParser((RewardConfig,)).parse_args_into_dataclasses(
        ["--speedup_baseline", "compile", "--speedup_clip_max", "2.5", "--integrity_weight", "3"]
    )
    assert config == RewardConfig(
        speedup_baseline="compile", speedup_clip_max=2.5, integrity_weight=3.0
    )


# --------------------------------------------------------------------------- real GPU records
# EvalResults the environment wrote on an H100 (scripts/reward_records_gpu.py): eight bundled
# Triton solutions, a matmul left to torch (caught statically), and a "lazy" ReLU that passes
# every check but spends its time in torch copy kernels (x.t().contiguous() round trips).
H100_RESULTS = Path(__file__).parents[1] / "fixtures" / "rewards_h100_eval_results.jsonl"


def h100_results() -> list[EvalResult]:
    return [
        EvalResult.from_dict(json.loads(line)) for line in H100_RESULTS.read_text().splitlines()
    ]


def test_rewards_of_real_h100_results() -> None:
    results = h100_results()
    honest_relu, cheat, lazy_relu = results[0], results[8], results[9]
    assert honest_relu.task_id == lazy_relu.task_id == "01_relu" and honest_relu.timing_meaningful
    honest, lazy = reward_components(honest_relu), reward_components(lazy_relu)
    assert (
        honest["profiling_reward"] == pytest.approx(honest_relu.own_kernel_share)
        and honest_relu.own_kernel_share > 0.9
    )
    assert honest["speedup_reward"] == pytest.approx(math.log2(honest_relu.speedup_vs_eager))
    assert (
        lazy["profiling_reward"] == pytest.approx(lazy_relu.own_kernel_share)
        and lazy_relu.own_kernel_share < 0.1
    )
    assert lazy["speedup_reward"] == -1.0  # ~19x slower than eager, clipped
    assert total_reward(honest_relu) > total_reward(lazy_relu) > total_reward(cheat)
    assert reward_components(cheat)["integrity_penalty"] == -1.0  # one failed check
    for r in results[:8]:  # every bundled solution is correct with a speedup in the clip range
        assert reward_components(r)["correctness_reward"] == 1.0
        assert -1.0 <= reward_components(r)["speedup_reward"] <= 3.0


# --------------------------------------------------------------------------- Dr. Kernel's reward
DRK = drkernel_reward_config()


@pytest.mark.parametrize(
    ("speedup", "share", "expected"),
    [
        (5.0, 0.8, 0.5 + 0.5 * 3.0 + 0.5 * 0.8),  # speedup capped at 3
        (2.0, 0.8, 0.5 + 0.5 * 2.0 + 0.5 * 0.8),
        (0.5, 1.0, 0.5 + 0.5 * 0.5 + 0.5 * 1.0),  # slower than eager: still its speedup, linear
        (1.0, 0.0, 0.5 + 0.5 * 1.0),
    ],
)
def test_drkernel_reward_when_correct(speedup: float, share: float, expected: float) -> None:
    r = gpu_correct(speedup_eager=speedup, share=share)
    assert total_reward(r, DRK) == pytest.approx(expected)
    parts = reward_components(r, DRK)
    assert parts["speedup_reward"] == pytest.approx(min(speedup, 3.0))
    assert parts["profiling_reward"] == pytest.approx(share)


@pytest.mark.parametrize(
    "status", [s for s in Status if s not in (Status.CORRECT, Status.HARNESS_ERROR)]
)
def test_drkernel_reward_is_zero_on_every_failure(status: Status) -> None:
    # Incorrect, crashed, cheating (their decoy kernel: penalty_score 0), unparseable: 0.
    r = result(status, device="cuda", timing_meaningful=True, speedup_vs_eager=2.0,
               own_kernel_share=0.9, checks_failed=["side_stream"])  # fmt: skip
    assert total_reward(r, DRK) == 0.0


def test_drkernel_reward_unscored_and_cpu() -> None:
    assert math.isnan(total_reward(result(Status.HARNESS_ERROR), DRK))  # never 0
    # CPU: no meaningful speedup, no profile: 0.5 + 0.5 * profiling_cpu_fallback.
    assert total_reward(cpu_correct(), DRK) == pytest.approx(1.0)
    no_fallback = drkernel_reward_config(profiling_cpu_fallback=0.0)
    assert total_reward(cpu_correct(), no_fallback) == pytest.approx(0.5)
    compile_based = drkernel_reward_config(speedup_baseline="compile")
    r = gpu_correct(speedup_eager=4.0, speedup_compile=1.5, share=1.0)
    assert total_reward(r, compile_based) == pytest.approx(0.5 + 0.75 + 0.5)


def test_drkernel_reward_funcs_and_weights() -> None:
    funcs, weights = build_reward_funcs(DRK)
    assert dict(zip(COMPONENT_NAMES, weights, strict=True)) == {
        "format_reward": 0.0,
        "correctness_reward": 0.5,
        "speedup_reward": 0.5,
        "profiling_reward": 0.5,
        "integrity_penalty": 0.0,
    }
    r = gpu_correct(speedup_eager=2.5, share=0.6)
    values = [f(["p"], ["c"], eval_results=[r])[0] for f in funcs]
    assert sum(w * v for w, v in zip(weights, values, strict=True)) == pytest.approx(
        0.5 + 1.25 + 0.3
    )


def test_linear_speedup_lower_bound() -> None:
    # KernelGYM's lower bound (1.0 in their 8B default): a speedup under it earns nothing.
    config = RewardConfig(speedup_transform="linear", speedup_clip_min=1.0, speedup_clip_max=3.0)
    assert component("speedup_reward", gpu_correct(speedup_eager=0.8), config) == 0.0
    assert component("speedup_reward", gpu_correct(speedup_eager=1.2), config) == pytest.approx(1.2)
    assert component("speedup_reward", gpu_correct(speedup_eager=9.0), config) == 3.0
    with pytest.raises(ValueError, match="speedup_transform"):
        RewardConfig(speedup_transform="sqrt")
