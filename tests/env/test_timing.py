"""Timing over several placements: how their summaries combine, and what each device times."""

from __future__ import annotations

import itertools
import math
import time
import types
from dataclasses import asdict

import pytest
import torch

from kernelrl.env.result import TimingStats
from kernelrl.env.sandbox import harness
from kernelrl.env.timing import (
    TimingConfig,
    TimingSteps,
    _enough,
    _sleep_cycles_per_us,
    average,
    placements,
    time_fn,
)


def test_placements_average_their_medians_and_errors() -> None:
    runs = [
        TimingStats(1.0, 0.9, 1.1, 0.8, 1.5, 30, 0.01),
        TimingStats(1.2, 1.1, 1.3, 1.0, 1.4, 50, 0.02),
    ]
    combined = average(runs)
    assert combined.median_ms == pytest.approx(1.1)
    assert (combined.p25_ms, combined.p75_ms) == (pytest.approx(1.0), pytest.approx(1.2))
    assert (combined.min_ms, combined.max_ms, combined.reps) == (0.8, 1.5, 80)
    # The medians lie further apart than their own errors say: the standard error of their mean
    # is taken from their spread, stdev(1.0, 1.2) / sqrt(2) = 0.1, relative to 1.1.
    assert combined.rel_err == pytest.approx(0.1 / 1.1)
    assert combined.placement_medians_ms == [1.0, 1.2]
    # Medians that agree better than their errors: the errors' sum, sqrt(0.01^2 + 0.0201^2) / 2.
    agreeing = average([runs[0], TimingStats(1.005, 0.9, 1.1, 0.8, 1.5, 30, 0.02)])
    assert agreeing.rel_err == pytest.approx(math.hypot(0.01, 0.0201) / 2 / 1.0025)
    # One placement (a CPU, a large task): its own error.
    assert average(runs[:1]).rel_err == pytest.approx(0.01)


def test_a_sandbox_s_placement_medians_are_read_as_numbers_it_could_have_timed() -> None:
    """What a sandbox reports of its placements is its own word, read field by field: a list
    longer than the placements timed, or a median that is not a positive number, is refused
    as its failure (``ValueError``), never kept in a result."""
    report = asdict(average([TimingStats(1.0, 0.9, 1.1, 0.8, 1.5, 30, 0.01)] * 2))
    assert TimingStats.from_report(report, 4).placement_medians_ms == [1.0, 1.0]
    for bad in ([1.0] * 5, [1.0, float("nan")], [1.0, 0.0], [1.0, -2.0], ["fast"], "123"):
        with pytest.raises(ValueError):
            TimingStats.from_report({**report, "placement_medians_ms": bad}, 4)
    older = {k: v for k, v in report.items() if k != "placement_medians_ms"}
    assert TimingStats.from_report(older, 4).placement_medians_ms == []
    assert TimingStats(**older).placement_medians_ms == []  # results stored before the field


def test_only_a_gpu_times_several_placements() -> None:
    config = TimingConfig(placements=3, most_placements=5)
    assert placements(torch.device("cuda"), config) == 5
    assert placements(torch.device("cpu"), config) == 1
    assert config.fingerprint() != TimingConfig(placements=1).fingerprint()

    calls = [0, 0]

    def first() -> None:
        calls[0] += 1

    def second() -> None:
        calls[1] += 1

    stats = time_fn([first, second], torch.device("cpu"), config)
    assert calls[0] == stats.reps + 1 and calls[1] == 0  # warm-up call + timed ones


@pytest.mark.gpu
def test_a_gpu_times_every_placement() -> None:
    x = torch.randn(1 << 20, device="cuda")
    counts = [0, 0, 0]

    def call_for(index: int):
        def call() -> None:
            counts[index] += 1
            x.mul(2.0)

        return call

    config = TimingConfig(placements=3)
    stats = time_fn([call_for(i) for i in range(3)], torch.device("cuda"), config)
    assert all(count >= config.min_reps for count in counts)
    assert stats.reps >= 3 * config.min_reps


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_hooks_run_once_around_each_input_set_timed(device: str) -> None:
    """``after_placement``, where the reference takes its turn (interleaved timing): after every
    set's last timed call; ``before_placement``, where the local memory moves: before its first
    (its warm-up's included). A CPU times one set."""
    events: list[tuple[str, int]] = []

    def call_for(index: int):
        def call() -> None:
            if not events or events[-1] != ("call", index):
                events.append(("call", index))

        return call

    config = TimingConfig(placements=3, min_reps=3, max_reps=5)
    time_fn(
        [call_for(i) for i in range(3)],
        torch.device(device),
        config,
        after_placement=lambda index: events.append(("after", index)),
        before_placement=lambda index: events.append(("before", index)),
    )
    sets = 3 if device == "cuda" else 1
    kinds = ("before", "call", "after")
    assert events == [(kind, i) for i in range(sets) for kind in kinds]


@pytest.mark.gpu
def test_only_the_first_placement_warms_up_for_warmup_ms() -> None:
    """The placements follow one another without a gap: after the first, the GPU is at clock,
    and each later one warms its own input set for ``placement_warmup_ms`` only."""
    cycles = int(500 * _sleep_cycles_per_us())  # about half a millisecond
    counts = [0, 0, 0]

    def call_for(index: int):
        def call() -> None:
            counts[index] += 1
            torch.cuda._sleep(cycles)

        return call

    # A fixed number of timed calls, so the rest of each count is warm-up (plus the first
    # call and the estimate).
    config = TimingConfig(placements=3, min_reps=30, max_reps=30, warmup_ms=25.0)
    time_fn([call_for(i) for i in range(3)], torch.device("cuda"), config)
    warmups = [count - config.max_reps - 2 for count in counts]
    assert warmups[0] >= 20  # ~25 ms of half-millisecond calls
    assert all(1 <= w <= 10 for w in warmups[1:])  # ~2 ms


@pytest.mark.gpu
@pytest.mark.parametrize("flush", ["read", "write", "none"])
def test_every_l2_flush_times_the_same_kernel_alike(flush: str) -> None:
    """L2 is emptied by reading (the default), zeroing or not at all; a kernel that reads far
    more than L2 holds times within a few percent whichever way."""
    x = torch.randn(1 << 26, device="cuda")  # 256 MB
    config = TimingConfig(placements=1, l2_flush=flush)
    reads = time_fn([lambda: x.sum()], torch.device("cuda"), config)
    baseline = time_fn([lambda: x.sum()], torch.device("cuda"), TimingConfig(placements=1))
    assert reads.median_ms == pytest.approx(baseline.median_ms, rel=0.15)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_steps_of_a_timing_run_account_for_its_wall_time(device: str) -> None:
    """Where an exclusive window's time goes: the steps add up to the run's wall time (less
    the loop's own bookkeeping), the work between batches is told apart from the repetitions,
    and on a GPU the holds sized from the host's time per call are part of the repetitions."""
    x = torch.randn(1 << 16, device=device)
    refreshes = [0]

    def prepare() -> None:
        refreshes[0] += 1
        x.mul_(1.0)

    def between() -> None:
        time.sleep(0.002)

    steps = TimingSteps()
    config = TimingConfig(placements=2, min_reps=20, max_reps=20, cpu_min_reps=20)
    start = time.perf_counter()
    time_fn(
        [lambda: x.sum()] * 2,
        torch.device(device),
        config,
        between_batches=between,
        prepares=[prepare] * 2,
        steps=steps,
    )
    wall = time.perf_counter() - start
    accounted = steps.setup_s + steps.warmup_s + steps.reps_s + steps.between_s
    assert 0.8 * wall <= accounted <= wall
    batches = 2 * 2 if device == "cuda" else 20  # a CPU runs it after every repetition
    assert steps.between_s >= batches * 0.002
    assert 0 < steps.host_call_s < steps.reps_s
    assert set(steps.phases()) == {
        "timing_setup",
        "timing_warmup",
        "timing_reps",
        "timing_hold",
        "timing_between",
        "timing_host_call",
    }
    if device == "cuda":
        assert steps.warmup_s > 0 and 0 < steps.hold_s < steps.reps_s
    else:
        assert steps.warmup_s == 0 and steps.hold_s == 0


def test_an_unknown_l2_flush_is_refused() -> None:
    with pytest.raises(ValueError, match="l2_flush must be one of read, write, none"):
        TimingConfig(l2_flush="zero")
    assert TimingConfig(l2_flush="write").fingerprint() != TimingConfig().fingerprint()


def test_timed_calls_adding_up_to_enough_stop_a_placement_before_min_reps() -> None:
    config = TimingConfig(min_reps=30, enough_timed_ms=50.0)
    assert not _enough([6.0] * 8, config)  # 48 ms
    assert _enough([6.0] * 10, config)  # 60 ms
    assert not _enough([0.1] * 29, config) and _enough([0.1] * 30, config)
    assert not _enough([6.0] * 10, TimingConfig(min_reps=30, enough_timed_ms=0.0))  # off
    assert TimingConfig().enough_timed_ms == 50.0


@pytest.mark.gpu
def test_a_long_kernel_is_timed_in_fewer_calls_with_enough_timed_ms() -> None:
    """A 5-ms kernel: one batch of 10 calls adds up to 50 ms, enough where 40 ms is; the
    median is the same as with the full minimum of repetitions."""
    cycles = int(5000 * _sleep_cycles_per_us())
    reps, medians = {}, {}
    for enough in (0.0, 40.0):  # off, and short of the default
        config = TimingConfig(placements=1, min_reps=30, enough_timed_ms=enough)
        stats = time_fn([lambda: torch.cuda._sleep(cycles)], torch.device("cuda"), config)
        reps[enough], medians[enough] = stats.reps, stats.median_ms
    assert reps == {0.0: 30, 40.0: 10}, reps
    assert medians[40.0] == pytest.approx(medians[0.0], rel=0.02), medians


def test_a_task_too_large_for_more_placements_is_timed_on_fewer() -> None:
    module = types.ModuleType("large_task")
    made = []

    def get_inputs() -> list[torch.Tensor]:
        if len(made) == 2:  # the GPU has room for two sets only
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        made.append(torch.randn(4))
        return [made[-1]]

    module.get_inputs = get_inputs
    cpu = torch.device("cpu")
    timed = harness.TimedInputs(lambda seed: harness.make_inputs(module, seed, cpu), 7, 4)
    assert [s[0] for s in timed.sets] == made and len(made) == 2


def _random_task() -> types.ModuleType:
    module = types.ModuleType("random_task")
    module.get_inputs = lambda: [torch.randn(8, 16), 3]
    return module


def test_every_timed_call_gets_fresh_contents_the_trusted_side_can_remake() -> None:
    module, cpu = _random_task(), torch.device("cpu")
    timed = harness.TimedInputs(lambda seed: harness.make_inputs(module, seed, cpu), 100, 4)
    seen = []

    def call() -> None:
        placement = 2
        x = timed.sets[placement][0]
        seen.append(x.clone())
        version = timed.versions[placement]
        seed = harness.timed_input_seed(100, placement, version, 4)
        assert torch.equal(x, harness.make_inputs(module, seed, cpu)[0])

    config = TimingConfig(cpu_min_reps=5)
    time_fn([call], cpu, config, prepares=[lambda: timed.refresh(2)])
    assert len(seen) == 1 + 5  # the untimed first call and the timed ones, all fresh
    assert all(not torch.equal(a, b) for a, b in itertools.pairwise(seen))
    assert [t.shape for t in seen] == [torch.Size([8, 16])] * 6
    assert timed.versions[2] == 6


def test_seeds_of_timed_contents_never_collide_across_placements() -> None:
    seeds = {harness.timed_input_seed(5, p, v, 4) for p in range(4) for v in range(100)}
    assert len(seeds) == 400


def test_fresh_contents_keep_their_placement_s_memory() -> None:
    module, cpu = _random_task(), torch.device("cpu")
    timed = harness.TimedInputs(lambda seed: harness.make_inputs(module, seed, cpu), 1, 1)
    before = timed.sets[0][0]
    pointer, contents = before.data_ptr(), before.clone()
    timed.refresh(0)
    assert timed.sets[0][0] is before and before.data_ptr() == pointer
    assert not torch.equal(before, contents)
    assert torch.equal(before, harness.make_inputs(module, timed.seed(0, 1), cpu)[0])


def test_without_room_for_a_second_copy_the_old_contents_go_first() -> None:
    module, cpu = _random_task(), torch.device("cpu")
    full = [False]

    def make(seed: int) -> list:
        if full[0]:
            full[0] = False  # once the old contents are dropped, the new ones fit
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return harness.make_inputs(module, seed, cpu)

    timed = harness.TimedInputs(make, 1, 1)
    full[0] = True
    timed.refresh(0)
    assert not timed.dropped_held()
    kept_by_the_model = timed.sets[0][0]
    full[0] = True
    timed.refresh(0)
    assert timed.sets[0][0] is not kept_by_the_model
    assert timed.dropped_held()  # the model holds what the harness dropped
    del kept_by_the_model
    assert not timed.dropped_held()


def test_the_harness_s_input_generation_is_not_the_solution_s_compute() -> None:
    from torch.profiler import ProfilerActivity, profile

    from kernelrl.env.sandbox.timed_run import aten_compute

    module, cpu = _random_task(), torch.device("cpu")
    timed = harness.TimedInputs(lambda seed: harness.make_inputs(module, seed, cpu), 1, 1)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        timed.refresh(0)  # randn: compute, but the harness's
        torch.sin(timed.sets[0][0])  # the solution's
    assert aten_compute(prof.profiler.kineto_results.events()) == {"aten::sin": 1}


def test_timing_without_fresh_inputs_never_prepares() -> None:
    prepared = []
    config = TimingConfig(cpu_min_reps=3, fresh_inputs=False)
    time_fn([lambda: None], torch.device("cpu"), config, prepares=[lambda: prepared.append(1)])
    assert prepared == []
    time_fn(
        [lambda: None],
        torch.device("cpu"),
        TimingConfig(cpu_min_reps=3),
        prepares=[lambda: prepared.append(1)],
    )
    assert len(prepared) == 4  # the untimed first call and three timed ones


def test_after_call_runs_right_after_every_call_outside_the_timed_span() -> None:
    """The kept output of a timed call is copied in ``after_call``: it must follow each call
    before anything else runs (the next refresh, a spot audit), warm-up call included."""
    order: list[str] = []
    spans: list[tuple[float, float]] = []

    def call() -> None:
        spans.append((time.perf_counter(), 0.0))
        order.append("call")

    def after() -> None:
        order.append("after")
        spans[-1] = (spans[-1][0], time.perf_counter())
        time.sleep(0.01)  # outside the span: no sample may include it

    config = TimingConfig(cpu_min_reps=4)
    stats = time_fn(
        [call],
        torch.device("cpu"),
        config,
        between_batches=lambda: order.append("between"),
        prepares=[lambda: order.append("prepare")],
        after_call=after,
    )
    calls = [i for i, step in enumerate(order) if step == "call"]
    assert len(calls) == 1 + 4
    assert all(order[i + 1] == "after" for i in calls)
    assert stats.max_ms < 10.0  # the sleep in after_call was never timed


def test_a_kept_output_is_what_its_call_had_written_when_it_ended() -> None:
    """A timed call may leave its output unwritten and fill it later (during an untimed call,
    or before the harness reads it at the end): what is compared is a copy made at once."""
    import random

    from kernelrl.env.sandbox.timed_run import KeptOutputs

    kept = KeptOutputs(1, random.Random(0))
    unwritten = torch.zeros(8)
    kept.offer(0, 3, unwritten, torch.device("cpu"))  # the first call of a set is always kept
    unwritten.fill_(7.0)  # completed later, by another call
    ((index, version, values),) = kept.kept()
    assert (index, version) == (0, 3)
    assert torch.equal(values[0], torch.zeros(8))
    assert values[0].data_ptr() != unwritten.data_ptr()


def test_a_refresh_copes_with_what_the_solution_did_to_its_inputs() -> None:
    """The solution holds the timed input tensors: marked as requiring grad, restrided, its
    storage swapped for one of its own or freed, an input still gets the next contents, and
    nothing the solution owns is written."""
    module, cpu = _random_task(), torch.device("cpu")
    timed = harness.TimedInputs(lambda seed: harness.make_inputs(module, seed, cpu), 1, 1)
    theirs = torch.zeros(8, 16)
    for change in (
        lambda x: x.requires_grad_(True),
        lambda x: x.t_(),
        lambda x: x.set_(theirs.untyped_storage(), 0, (8, 16), (16, 1)),
        lambda x: x.untyped_storage().resize_(0),
    ):
        change(timed.sets[0][0])
        timed.refresh(0)
        fresh = harness.make_inputs(module, timed.seed(0, timed.versions[0]), cpu)[0]
        assert torch.equal(timed.sets[0][0], fresh)
        assert not timed.sets[0][0].requires_grad
    assert torch.equal(theirs, torch.zeros(8, 16))
    pointer = timed.sets[0][0].data_ptr()
    timed.refresh(0)  # left alone: the same memory again
    assert timed.sets[0][0].data_ptr() == pointer


def test_a_placement_may_stop_after_one_batch_once_its_error_target_is_met() -> None:
    config = TimingConfig()
    assert config.min_reps == config.batch == 10
    assert not _enough([0.1] * 9, config) and _enough([0.1] * 10, config)


def test_the_fingerprint_names_the_procedure_as_well_as_its_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A change the options do not name (how the flush reads, say) raises ``PROCEDURE``, and
    timings cached under the old procedure are then not reused."""
    from kernelrl.env import timing

    before = TimingConfig().fingerprint()
    monkeypatch.setattr(timing, "PROCEDURE", timing.PROCEDURE + 1)
    assert TimingConfig().fingerprint() != before
