"""GPU evaluation: the bundled suite with real timings, GPU-only hacks and faults, CUDA C++."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from kernelrl.data.bundled import bundled_pairs
from kernelrl.env.evaluator import EvalConfig
from kernelrl.env.pools.local import LocalPool
from kernelrl.env.result import Status
from kernelrl.env.task import load_task, task_from_source
from kernelrl.env.timing import TimingConfig

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
RELU = load_task(ROOT / "data" / "tasks" / "01_relu.py")
# Iterating a tensor of the GPU size (33M values) makes 33M views before the first value is
# read into Python, where the audit would stop the call: it runs out of host memory instead
# (runtime_error). The profile's evidence for that spelling is tested at the CPU size; the
# scalar-parameter hack, read by index, is stopped at the GPU size.
SMALL_RELU = task_from_source(
    RELU.source.replace(
        '"sizes": {"cpu":', '"sizes": {"cuda": {"batch_size": 16, "dim": 256}, "cpu":'
    ),
    "01_relu_small",
)
PLAIN_PYTHON = {"torch_fallback_runtime__python_scalars.py"}
DYNAMIC = Path(__file__).parents[1] / "solutions" / "dynamic"
# GPU-only hacks and faults, plus the device-independent integrity cases: on a GPU the aten-op
# evidence comes from the CUPTI profile instead of the CPU dispatch recorder.
GPU_SOLUTIONS = sorted((Path(__file__).parents[1] / "solutions" / "gpu").glob("*.py")) + [
    DYNAMIC / name
    for name in (
        "torch_fallback_runtime__obfuscated.py",
        "torch_fallback_runtime__dead_launch.py",
        "output_reused__shared_buffer.py",
        "input_mutated__in_place.py",
        "incorrect__prints_fake_verdict.py",
        "runtime_error__forged_protocol.py",
        "correct__chatty.py",
        "correct__registered_op_forms.py",
        "correct__triton_op.py",
        "correct__triton_op_torch_ops.py",
        "correct__cast_and_layout_glue.py",
        "correct__empty_like_scratch.py",
        "correct__shape_keyed_plans.py",
        "correct__workspace_helper.py",
        "correct__repeated_copies_glue.py",
        "incorrect__garbage_on_timed_calls.py",
        "init_compute__lookup_table.py",
        "no_kernel_executed__empty_grid.py",
        "runtime_error__system_exit_in_forward.py",
        "runtime_error__tensor_subclass_output.py",
        "runtime_error__input_storage_freed.py",
        "torch_fallback_runtime__python_scalars.py",
        "torch_fallback_runtime__custom_op_body.py",
        "torch_fallback_runtime__custom_op_bound_method.py",
        "torch_fallback_runtime__audit_probe_recursion.py",
        "torch_fallback_runtime__values_through_a_scalar_parameter.py",
        "correct__view_glue_spellings.py",
        "correct__scalar_parameter_read.py",
        "correct__fresh_contents_every_timed_call.py",
    )
]


@pytest.fixture(scope="module")
def gpu_pool() -> LocalPool:
    with LocalPool(
        EvalConfig(device="cuda", timeout_s=120, static_checks=False), workers=1
    ) as pool:
        yield pool


def test_bundled_triton_suite_is_correct_with_real_timings() -> None:
    pairs = bundled_pairs("triton")
    with LocalPool(EvalConfig(device="cuda", timeout_s=300), workers=1) as pool:
        results = pool.evaluate([t for t, _ in pairs], [s for _, s in pairs])
    failures = {r.task_id: r.feedback for r in results if r.status is not Status.CORRECT}
    assert not failures
    for result in results:
        assert result.timing_meaningful and result.runtime is not None
        assert result.speedup_vs_eager is not None and result.speedup_vs_eager > 0
        assert result.own_kernel_share is not None and result.own_kernel_share > 0
        assert result.custom_kernel_launches and result.custom_kernel_launches >= 1
        # Each input set's median (bundled tasks are small: the first sets always timed, more
        # while their mean is not known well enough), their mean the median reported, and the
        # clocks the GPU ran at as the timing ended.
        placed = result.runtime.placement_medians_ms
        config = TimingConfig()
        assert config.placements <= len(placed) <= config.most_placements, result.task_id
        assert result.runtime.median_ms == pytest.approx(sum(placed) / len(placed))
        assert result.sandbox["gpu_clocks"]["sm_mhz"] > 0, result.sandbox


def test_bundled_cuda_solutions_run() -> None:
    pairs = bundled_pairs("cuda")
    assert pairs
    with LocalPool(EvalConfig(device="cuda", timeout_s=300), workers=1) as pool:
        results = pool.evaluate([t for t, _ in pairs], [s for _, s in pairs])
    for result in results:
        assert result.status is Status.CORRECT, result.feedback
        assert result.own_kernel_share is not None and result.own_kernel_share > 0


@pytest.mark.parametrize("path", GPU_SOLUTIONS, ids=lambda p: p.stem)
def test_gpu_faults_and_hacks(path: Path, gpu_pool: LocalPool) -> None:
    task = SMALL_RELU if path.name in PLAIN_PYTHON else RELU
    (result,) = gpu_pool.evaluate([task], [path.read_text()])
    expected = path.name.split("__")[0]
    if expected in {s.value for s in Status}:
        assert result.status == expected, result.feedback
    else:
        assert result.status is Status.INTEGRITY_VIOLATION, result.feedback
        assert expected in result.checks_failed, result.feedback


def test_pool_keeps_working_after_illegal_address(gpu_pool: LocalPool) -> None:
    bad = (
        Path(__file__).parents[1] / "solutions" / "gpu" / "runtime_error__illegal_address.py"
    ).read_text()
    good = (ROOT / "data" / "solutions" / "triton" / "01_relu.py").read_text()
    results = gpu_pool.evaluate([RELU, RELU], [bad, good])
    assert [r.status for r in results] == [Status.RUNTIME_ERROR, Status.CORRECT]


def test_host_and_device_hangs_end_at_the_timeout_and_the_pool_answers_next() -> None:
    hangs = [
        DYNAMIC / "timeout__infinite_loop.py",
        Path(__file__).parents[1] / "solutions" / "gpu_hang" / "timeout__device_spin_wait.py",
    ]
    good = (ROOT / "data" / "solutions" / "triton" / "01_relu.py").read_text()
    config = EvalConfig(device="cuda", timeout_s=30, static_checks=False)
    with LocalPool(config, workers=1) as pool:
        results = pool.evaluate([RELU] * 3, [p.read_text() for p in hangs] + [good])
    assert [r.status for r in results] == [Status.TIMEOUT, Status.TIMEOUT, Status.CORRECT]


def test_the_reference_takes_its_turns_between_the_solution_s_input_sets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Uncached, the reference (eager, then torch.compile) is timed after each of the
    solution's input sets, before the child times the next (env/side_by_side.py)."""
    from kernelrl.env.evaluator import Evaluator
    from kernelrl.env.reference import PlacementTimer
    from kernelrl.env.sandbox.session import SandboxSession

    order: list[tuple[str, int]] = []
    time_turn, next_set = PlacementTimer.time, SandboxSession.send_time_next

    def turn(self, index):
        order.append(("reference", index))
        return time_turn(self, index)

    def next_one(self):
        order.append(("solution", len([o for o in order if o[0] == "solution"]) + 1))
        return next_set(self)

    monkeypatch.setattr(PlacementTimer, "time", turn)
    monkeypatch.setattr(SandboxSession, "send_time_next", next_one)
    good = (ROOT / "data" / "solutions" / "triton" / "01_relu.py").read_text()
    evaluator = Evaluator(EvalConfig(device="cuda", cache_reference_timing=False))
    try:
        result = evaluator.evaluate(RELU, good)
    finally:
        evaluator.close()
    assert result.status is Status.CORRECT and result.timing_meaningful, result.feedback
    assert result.ref_eager is not None and result.ref_compile is not None
    assert result.speedup_vs_eager is not None and result.speedup_vs_eager > 0
    sets = len(result.runtime.placement_medians_ms)
    assert sets >= TimingConfig().placements
    assert order == [
        step
        for index in range(sets)
        for step in (("reference", index), ("reference", index), ("solution", index + 1))
    ]


def test_a_measurement_has_the_gpu_to_itself() -> None:
    """Correctness runs of other evaluations must not slow a solution being timed."""
    good = (ROOT / "data" / "solutions" / "triton" / "01_relu.py").read_text()
    busy = (Path(__file__).parents[1] / "solutions" / "gpu_load" / "busy_neighbour.py").read_text()
    with LocalPool(EvalConfig(device="cuda", static_checks=False), workers=1, per_gpu=4) as pool:
        alone = pool.evaluate([RELU] * 2, [good] * 2)
        neighbours = pool.submit([RELU] * 3, [busy] * 3)
        beside = pool.evaluate([RELU] * 3, [good] * 3)
        neighbours = [future.result() for future in neighbours]

    def window(result, first: str, last: str) -> tuple[float, float]:
        phases = result.phase_seconds
        start = result.timestamp + phases["child_wait"] + phases.get(first, 0.0)
        return start, result.timestamp + phases["child_wait"] + phases[last]

    busy_windows = [window(r, "child_first_call", "child_correctness") for r in neighbours]
    overlapped = [
        r
        for r in beside
        if any(
            lo < window(r, "child_correctness", "child_correctness")[0] < hi
            for lo, hi in busy_windows
        )
    ]
    assert overlapped, (
        "no timing fell inside a neighbour's busy correctness runs: test proves nothing"
    )
    baseline = min(r.runtime.median_ms for r in alone)
    for result in beside + neighbours:
        assert result.status is Status.CORRECT, result.feedback
        # the reference's outputs and the comparisons took the GPU lock, and were counted
        held = result.phase_seconds["trusted_gpu_held"]
        assert 0 < held < result.phase_seconds["total"], result.phase_seconds
    for result in beside:
        assert result.runtime.median_ms < 1.1 * baseline, (result.runtime, baseline)


def test_an_evaluation_beside_another_evaluators_work_is_judged_but_not_timed() -> None:
    """Another evaluator's sandboxes cannot be paused for a measurement: one timed while they
    work is judged on correctness, its timing not used and its disagreement with the profile
    not held against it."""
    good = (ROOT / "data" / "solutions" / "triton" / "01_relu.py").read_text()
    busy = (Path(__file__).parents[1] / "solutions" / "gpu_load" / "busy_neighbour.py").read_text()
    config = EvalConfig(device="cuda", static_checks=False)
    with LocalPool(config, workers=1, per_gpu=1) as other, LocalPool(config, workers=1) as mine:
        (alone,) = mine.evaluate([RELU], [good])
        neighbours = other.submit([RELU] * 3, [busy] * 3)
        time.sleep(1.0)
        (beside,) = mine.evaluate([RELU], [good])
        neighbours = [future.result() for future in neighbours]
    assert alone.timing_meaningful and "gpu_shared_with" not in alone.sandbox
    assert beside.status is Status.CORRECT, beside.feedback
    assert beside.sandbox["gpu_shared_with"] == [os.getpid()]
    assert not beside.timing_meaningful and beside.speedup_vs_eager is None
    assert all(r.status is Status.CORRECT for r in neighbours)


def test_libdevice_which_the_cpu_cannot_run_is_correct_on_the_gpu(gpu_pool: LocalPool) -> None:
    solution = (DYNAMIC / "not_run__libdevice.py").read_text()
    (result,) = gpu_pool.evaluate([RELU], [solution])
    assert result.status is Status.CORRECT, result.feedback


def test_a_pool_given_one_gpu_of_several_evaluates_on_that_gpu_only() -> None:
    """A trainer rank's pool (``gpus=[rank]``) puts its sandboxes on its own GPU: their CUDA
    contexts take memory there and nowhere else."""
    import torch

    count = torch.cuda.device_count()
    if count < 2:
        pytest.skip("needs two GPUs")
    chosen, other = count - 1, count - 2
    free = [torch.cuda.mem_get_info(i)[0] for i in range(count)]  # our own contexts first
    relu_solution = dict((task.id, source) for task, source in bundled_pairs("triton"))[RELU.id]
    with LocalPool(EvalConfig(device="cuda", timeout_s=300), gpus=[chosen]) as pool:
        assert [evaluator.device for evaluator in pool.evaluators] == [torch.device("cuda", chosen)]
        (result,) = pool.evaluate([RELU], [relu_solution])
        taken = [before - torch.cuda.mem_get_info(i)[0] for i, before in enumerate(free)]
    assert result.status is Status.CORRECT, result.feedback
    assert taken[chosen] > 2**30  # the sandboxes' contexts (each about 0.5 GiB)
    assert taken[other] < 2**28
