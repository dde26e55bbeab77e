"""GPU work admitted by memory footprint: reservations wait for room, a task too large for the
device runs alone, and the plan of a KernelBench-sized task is what its tensors need."""

from __future__ import annotations

import threading
import time

import torch

from kernelrl.env.admission import (
    CHILD_OVERHEAD_BYTES,
    HARNESS_BYTES,
    MORE_SETS_BYTES,
    OUTPUT_SETS_AHEAD,
    GpuMemoryBudget,
    memory_plan,
    plan_for,
)
from kernelrl.env.evaluator import EvalConfig
from kernelrl.env.reference import ReferenceRunner
from kernelrl.env.sandbox.gpu_memory import GpuMemoryWatch, GpuShare, counted_until_exit
from kernelrl.env.sandbox.local_memory import MOVE_BYTES
from kernelrl.env.sandbox.processes import ChildPool
from kernelrl.env.sandboxed_reference import SandboxedReference, TaskReferences
from kernelrl.env.task import task_from_source
from kernelrl.env.timing import TimingConfig

GIB = 2**30


def _task(numel: int) -> str:
    return f"""
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.rand({numel})]

def get_init_inputs():
    return []
"""


def test_a_kernelbench_sized_task_is_planned_from_its_tensors() -> None:
    numel = 4096 * 393216  # KernelBench level 1, 19_ReLU: 6 GiB of fp32 in, 6 GiB out
    plan = memory_plan(task_from_source(_task(numel), "relu_big"), TimingConfig())
    tensor = numel * 4
    assert plan.large
    assert plan.trusted_bytes == 2 * tensor
    # Timed on one placement: its inputs and a refresh's new contents beside them, the current
    # output and one kept copy, a workspace of inputs and outputs, the harness's buffers, what
    # moving the local memory keeps for its one set.
    assert plan.placements == 1
    assert plan.child_bytes == 2 * tensor + 2 * tensor + 2 * tensor + HARNESS_BYTES + (
        MOVE_BYTES + CHILD_OVERHEAD_BYTES
    )
    small = memory_plan(task_from_source(_task(1024), "relu_small"), TimingConfig())
    assert not small.large and small.placements == 16
    assert small.total_bytes < 3 * GIB + 16 * MOVE_BYTES
    # The trusted side holds the reference's outputs of the checked calls made at once: a large
    # task's one call at a time.
    assert (plan.outputs_ahead, small.outputs_ahead) == (1, OUTPUT_SETS_AHEAD)
    assert small.trusted_bytes == 1024 * 4 * (1 + OUTPUT_SETS_AHEAD)


def test_more_input_sets_are_planned_while_they_fit_in_their_bytes() -> None:
    """The sets a timing may add to its first ``placements`` are counted while all of them fit
    in ``MORE_SETS_BYTES``: sixteen of a 128 MiB input, ten of 200 MiB, four (the first) of
    500 MiB, one of a large input."""
    timing = TimingConfig()
    mib = 2**20
    counts = [plan_for(n * mib, 0, mib, timing).placements for n in (1, 128, 200, 500, 600)]
    assert counts == [16, 16, 10, 4, 1]
    assert MORE_SETS_BYTES == 2 * GIB
    ten = plan_for(200 * mib, 0, 200 * mib, timing)
    four = plan_for(200 * mib, 0, 200 * mib, TimingConfig(most_placements=4))
    # six more input sets, and what moving the local memory keeps for each
    assert ten.child_bytes - four.child_bytes == 6 * (200 * mib + MOVE_BYTES)
    assert plan_for(mib, 0, mib, TimingConfig(placements=2, most_placements=2)).placements == 2


def test_a_plan_counts_the_input_sets_the_timing_asks_for() -> None:
    """A plan counted for fewer sets than the timing's own would cut the timing to them: an
    evaluator asked to time over 8 placements at most is planned, and timed, over 8."""
    task = task_from_source(_task(2**20), "relu_eight")
    four = memory_plan(task, TimingConfig(most_placements=4))
    eight = memory_plan(task, TimingConfig(most_placements=8))
    assert (four.placements, eight.placements) == (4, 8)
    assert eight.child_bytes - four.child_bytes == 4 * (2**20 * 4 + MOVE_BYTES)  # four more sets
    config = EvalConfig(device="cpu", timing=TimingConfig(most_placements=8))
    references = TaskReferences(ReferenceRunner(torch.device("cpu")), None, config)  # type: ignore[arg-type]
    plan, release = references.admit(task, GpuMemoryBudget(64 * GIB))
    release()
    assert plan is not None and plan.placements == 8


def test_a_plan_counts_what_moving_the_local_memory_keeps_for_every_input_set() -> None:
    task = task_from_source(_task(2**20), "relu_moved")
    still = memory_plan(task, TimingConfig(most_placements=8, move_local_memory=False))
    moved = memory_plan(task, TimingConfig(most_placements=8, move_local_memory=True))
    assert moved.child_bytes - still.child_bytes == 8 * MOVE_BYTES
    assert moved.trusted_bytes == still.trusted_bytes


def test_reservations_wait_until_they_fit() -> None:
    budget = GpuMemoryBudget(10 * GIB)
    order: list[str] = []
    release = threading.Event()

    def hold(name: str, nbytes: int) -> None:
        with budget.reserve(nbytes):
            order.append(f"start {name}")
            release.wait(5)
        order.append(f"end {name}")

    first = threading.Thread(target=hold, args=("a", 6 * GIB))
    first.start()
    while budget.in_flight == 0:
        time.sleep(0.01)
    second = threading.Thread(target=hold, args=("b", 6 * GIB))
    second.start()
    time.sleep(0.2)
    assert order == ["start a"]  # b does not fit beside a
    release.set()
    first.join(5)
    second.join(5)
    assert order == ["start a", "end a", "start b", "end b"]
    assert budget.reserved == 0 and budget.in_flight == 0


def _admitted_while_a_large_one_waits(
    in_order: bool, backfill: bool = False, c_bytes: int = 3 * GIB
) -> list[str]:
    """A holds 6 of 10 GiB; B asks for 8 and waits; C asks for ``c_bytes`` after B (it fits
    beside A). What was admitted, in order, once A gives its memory back."""
    budget = GpuMemoryBudget(10 * GIB, in_order=in_order, backfill=backfill)
    admitted: list[str] = []
    release_a = budget.acquire(6 * GIB)
    admitted.append("a")

    def ask(name: str, nbytes: int) -> None:
        release = budget.acquire(nbytes)
        admitted.append(name)
        release()

    b = threading.Thread(target=ask, args=("b", 8 * GIB))
    b.start()
    while not budget._waiting:
        time.sleep(0.01)
    c = threading.Thread(target=ask, args=("c", c_bytes))
    c.start()
    while "c" not in admitted and len(budget._waiting) < 2:  # C admitted, or queued behind B
        time.sleep(0.01)
    release_a()
    b.join(5)
    c.join(5)
    assert budget.reserved == 0 and budget.in_flight == 0 and not budget._waiting
    return admitted


def test_a_later_evaluation_passes_a_waiting_one_unless_the_admission_keeps_order() -> None:
    """By default C, which fits beside A, goes before B, which asked first and does not (the
    wait that a large published-size task can have while smaller ones keep arriving); in order,
    C waits for B."""
    assert _admitted_while_a_large_one_waits(in_order=False) == ["a", "c", "b"]
    assert _admitted_while_a_large_one_waits(in_order=True) == ["a", "b", "c"]


def test_a_backfill_passes_the_earliest_waiting_one_only_beside_its_plan() -> None:
    """With the backfill, C goes first only where it fits beside B's plan as well (2 + 8 of
    10 GiB), not where it would take memory B needs once A is done (3 + 8); in order alone, C
    waits either way, and first-fit lets either pass."""
    for c_bytes, backfilled in ((2 * GIB, ["a", "c", "b"]), (3 * GIB, ["a", "b", "c"])):
        assert _admitted_while_a_large_one_waits(True, True, c_bytes) == backfilled
        assert _admitted_while_a_large_one_waits(True, False, c_bytes) == ["a", "b", "c"]
        assert _admitted_while_a_large_one_waits(False, False, c_bytes) == ["a", "c", "b"]


def test_a_backfill_never_keeps_the_earliest_waiting_for_those_that_asked_after_it() -> None:
    """A holds 6 of 10 GiB and B waits for 8. C (2) starts beside A and B's plan; D (2), which
    first-fit would let in beside A and C, waits, so B starts the moment A is done, with C
    still running, and D after it."""
    budget = GpuMemoryBudget(10 * GIB, in_order=True, backfill=True)
    release_a = budget.acquire(6 * GIB)
    started: dict[str, threading.Event] = {n: threading.Event() for n in "bcd"}
    releases: dict[str, object] = {}

    def ask(name: str, nbytes: int) -> None:
        releases[name] = budget.acquire(nbytes)
        started[name].set()

    def queued(count: int, name: str) -> None:  # or started
        while len(budget._waiting) < count and not started[name].is_set():
            time.sleep(0.01)

    threads = [threading.Thread(target=ask, args=("b", 8 * GIB), daemon=True)]
    threads[0].start()
    queued(1, "b")
    threads.append(threading.Thread(target=ask, args=("c", 2 * GIB), daemon=True))
    threads[1].start()
    assert started["c"].wait(5)
    threads.append(threading.Thread(target=ask, args=("d", 2 * GIB), daemon=True))
    threads[2].start()
    queued(2, "d")
    assert not started["b"].is_set() and not started["d"].is_set()
    release_a()
    assert started["b"].wait(5)
    assert budget.reserved == 10 * GIB and not started["d"].is_set()  # C still running
    releases["c"]()
    assert started["d"].wait(5)
    releases["b"](), releases["d"]()
    for thread in threads:
        thread.join(5)
    assert budget.reserved == 0 and budget.in_flight == 0 and not budget._admitted


def test_a_task_larger_than_the_device_runs_alone() -> None:
    budget = GpuMemoryBudget(10 * GIB)
    with budget.reserve(40 * GIB):
        assert budget.in_flight == 1
    with budget.reserve(1 * GIB), budget.reserve(2 * GIB):
        assert budget.reserved == 3 * GIB


class _Listed:
    """NVML's list of the processes holding memory on the device, as ``Nvml.processes`` reads
    it from the driver (here without one; the GPU tests read the real list)."""

    def __init__(self, held: dict[int, int]) -> None:
        self.held = held

    def processes(self) -> dict[int, int | None]:
        return dict(self.held)


def _watch(held: dict[int, int]) -> GpuMemoryWatch:
    watch = GpuMemoryWatch.__new__(GpuMemoryWatch)
    watch.problem, watch.nvml = "", _Listed(held)  # type: ignore[assignment]
    return watch


def test_memory_a_retiring_child_holds_beyond_its_share_is_counted_until_it_exits() -> None:
    """A child that took more GPU memory than it was admitted with holds it until its exit is
    over: the next evaluation waits for the reaper's release instead of being admitted into
    memory that is not free (its inputs would not fit: a harness_error the other caused)."""
    budget = GpuMemoryBudget(10 * GIB)
    release = budget.acquire(1 * GIB)
    listed = {101: 8 * GIB, 102: 1 * GIB, 999: 5 * GIB}  # 999: not the child's
    share = GpuShare(_watch(listed), 1 * GIB)
    then = counted_until_exit(budget, share, [101, 102], release)
    assert budget.reserved == 9 * GIB and budget.in_flight == 1
    admitted = threading.Event()
    waiting = threading.Thread(target=lambda: (budget.acquire(2 * GIB), admitted.set()))
    waiting.start()
    assert not admitted.wait(0.2)  # 9 GiB held, 2 more do not fit in 10
    reaper = threading.Thread(target=then)  # the child's processes have exited...
    reaper.start()
    assert not admitted.wait(0.3)  # ...and the driver still lists their memory
    del listed[101], listed[102]
    assert admitted.wait(5)
    reaper.join(5)
    waiting.join(5)
    assert budget.reserved == 2 * GIB and budget.in_flight == 1
    then()
    assert budget.reserved == 2 * GIB  # given back once


def test_a_child_within_its_share_or_unwatched_is_released_as_it_was() -> None:
    budget = GpuMemoryBudget(10 * GIB)
    release = budget.acquire(1 * GIB)
    within = GpuShare(_watch({101: 1 * GIB}), 2 * GIB)
    assert counted_until_exit(budget, within, [101], release) is release
    unlisted = GpuShare(_watch({}), 1 * GIB)  # NVML lists none of its processes
    assert counted_until_exit(budget, unlisted, [101], release) is release
    assert counted_until_exit(budget, None, [101], release) is release
    assert counted_until_exit(None, within, [101], release) is release
    assert budget.reserved == 1 * GIB


def test_the_record_keeps_the_most_a_child_was_seen_to_hold_against_its_share() -> None:
    """How much of a plan solutions use is what would let plans shrink: the record keeps the
    most of every look, not the last, and says nothing where the driver lists no process."""
    listed = {101: 3 * GIB, 102: 1 * GIB}
    share = GpuShare(_watch(listed), 6 * GIB)
    assert share.over_share(lambda: [101, 102]) is None  # 4 GiB, within its share
    listed[101] = 1 * GIB  # the solution freed some before the evaluation ended
    assert share.beyond([101, 102]) == 0
    assert share.record() == {"admitted_gib": 6.0, "most_held_gib": 4.0}
    unlisted = GpuShare(_watch({}), 1 * GIB)
    assert unlisted.beyond([101]) == 0
    assert unlisted.record() == {"admitted_gib": 1.0, "most_held_gib": None}


def test_a_task_larger_than_the_device_waits_for_memory_a_dying_child_holds() -> None:
    """Running alone means with nothing else held: not beside a retired child's memory."""
    budget = GpuMemoryBudget(10 * GIB)
    give_back = budget.overdraw(3 * GIB)
    assert budget.in_flight == 0
    admitted = threading.Event()
    waiting = threading.Thread(target=lambda: (budget.acquire(40 * GIB), admitted.set()))
    waiting.start()
    assert not admitted.wait(0.2)
    give_back()
    assert admitted.wait(5)
    waiting.join(5)


def test_a_context_held_before_admission_counts_once_and_is_taken_over() -> None:
    """A child taken before its admission (an untrusted task's reference, which measures the
    footprint) holds its CUDA context while it waits: counted from then, so other evaluations
    cannot be admitted into it, and counted once, by the plan, after its admission. (Memory
    to whichever fits, so the later plan that fits only with its context counted once can
    pass the one waiting before it.)"""
    budget = GpuMemoryBudget(10 * GIB, in_order=False)
    running = budget.acquire(8 * GIB)
    context = budget.hold_context()
    assert budget.reserved == 9 * GIB and budget.in_flight == 1
    other = threading.Event()
    waiting = threading.Thread(target=lambda: (budget.acquire(2 * GIB), other.set()))
    waiting.start()
    assert not other.wait(0.2)  # 8 + 1 held: 2 more do not fit in 10
    admitted = threading.Event()
    # Its plan (2 GiB with the context) fits beside the 8 GiB once its own context is not
    # counted twice; the other evaluation waits on.
    mine = threading.Thread(target=lambda: (budget.acquire(2 * GIB, context), admitted.set()))
    mine.start()
    assert admitted.wait(5)
    mine.join(5)
    assert budget.reserved == 10 * GIB and budget.contexts_waiting == 0
    context()  # taken over: its release changes nothing
    assert budget.reserved == 10 * GIB and not other.is_set()
    running()
    assert other.wait(5)
    waiting.join(5)


def test_a_task_larger_than_the_device_is_not_kept_waiting_by_contexts_before_admission() -> None:
    """Running alone means no evaluation in flight: children waiting for their own admission
    hold contexts but run nothing, and two such large tasks do not wait for each other."""
    budget = GpuMemoryBudget(10 * GIB)
    first, second = budget.hold_context(), budget.hold_context()
    releases: list = []
    threads = [
        threading.Thread(target=lambda c=c: releases.append(budget.acquire(40 * GIB, c)))
        for c in (first, second)
    ]
    threads[0].start()
    threads[0].join(5)
    assert len(releases) == 1 and budget.in_flight == 1  # admitted beside the other's context
    threads[1].start()
    time.sleep(0.2)
    assert len(releases) == 1  # the second waits for the first to end
    releases[0]()
    threads[1].join(5)
    assert len(releases) == 2
    releases[1]()
    assert budget.reserved == 0 and budget.in_flight == 0 and budget.contexts_waiting == 0


def test_an_untrusted_reference_child_counts_its_context_while_it_waits() -> None:
    """A real reference child of an untrusted task: taken, it reports its footprint and waits
    for memory; meanwhile its context is counted, and once admitted only its plan is."""
    task = task_from_source(_task(1024), "client_relu", trusted=False)
    children = ChildPool("cpu", spare=0)
    budget = GpuMemoryBudget(40 * GIB)
    running = budget.acquire(39 * GIB)
    reference = SandboxedReference(task, children, torch.device("cpu"), EvalConfig(device="cpu"))
    started: list = []
    starting = threading.Thread(target=lambda: started.append(reference.start(budget)))
    try:
        starting.start()
        deadline = time.monotonic() + 120
        while budget.contexts_waiting == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert budget.contexts_waiting == 1 and budget.reserved == 40 * GIB
        running()  # room for its plan: admitted, its context now counted by the plan alone
        starting.join(120)
        ((plan, release),) = started
        assert plan is not None and budget.contexts_waiting == 0
        assert budget.reserved == plan.total_bytes and budget.in_flight == 1
        release()  # the solution's child has exited...
        reference.close()  # ...and the reference's: its reaper gives the plan back
        while budget.reserved and time.monotonic() < deadline:
            time.sleep(0.05)
        assert budget.reserved == 0 and budget.in_flight == 0
    finally:
        starting.join(5)
        children.close()


def test_a_context_given_up_before_admission_is_given_back() -> None:
    budget = GpuMemoryBudget(10 * GIB)
    context = budget.hold_context()
    assert budget.reserved == 1 * GIB
    context()
    context()
    assert budget.reserved == 0 and budget.contexts_waiting == 0


def test_a_release_from_another_thread_counts_once() -> None:
    """The reaper of an evaluation's child gives its memory back, after the verdict: the
    release works from any thread and a second call changes nothing."""
    budget = GpuMemoryBudget(10 * GIB)
    release = budget.acquire(6 * GIB)
    assert budget.reserved == 6 * GIB
    reaper = threading.Thread(target=release)
    reaper.start()
    reaper.join(5)
    release()
    assert budget.reserved == 0 and budget.in_flight == 0
    with budget.reserve(10 * GIB):
        assert budget.in_flight == 1
