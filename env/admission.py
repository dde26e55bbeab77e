"""GPU work admitted by its memory footprint.

A pool runs several evaluations on one GPU (16 on a 16-core host), which suits tasks of
megabytes. A KernelBench level-1 task of 6 GiB inputs needs that much in the sandbox and again
on the trusted side (reference inputs and outputs): four at once would exhaust an 80 GiB H100
and fail as out-of-memory errors that are nobody's fault. Each evaluation therefore reserves its estimated
footprint before it starts; a task too large to share the GPU waits until it can run alone.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from kernelrl.env.sandbox.harness import TIMED_OUTPUTS_CHECKED
from kernelrl.env.sandbox.local_memory import MOVE_BYTES
from kernelrl.env.sizes import estimate_footprint
from kernelrl.env.task import Task, TaskError
from kernelrl.env.timing import L2_FLUSH_BYTES, TimingConfig

GIB = 2**30
# CUDA context, CUPTI and allocator slack of one sandbox child, beside its tensors, and the
# output ring the worker allocates on the device for it (64 MiB, sandbox/device_ring.py).
CHILD_OVERHEAD_BYTES = 1 * GIB
# Above this many bytes of inputs and outputs a task is timed on one placement of its inputs, not
# several: placement matters for small memory-bound kernels (timing.py), and four copies of a
# 6 GiB KernelBench input would take the memory other evaluations were promised.
LARGE_TASK_BYTES = 512 * 2**20
# Input sets beyond the timing's first ``placements`` (``TimingConfig.most_placements``) are
# made only while all of them fit in this many bytes: what a short memory-bound kernel needs to
# average its placements over (a 128 MiB input: sixteen sets), not what a large input would take
# from the evaluations beside it.
MORE_SETS_BYTES = 2 * GIB
# The harness's own buffers in the child while it times: the L2 flush buffer, and the
# temporaries of an output's fingerprint (a 64 MiB chunk widened to int64, its positions and
# their products).
HARNESS_BYTES = L2_FLUSH_BYTES + 512 * 2**20
# The reference's outputs of this many correctness calls are made in one turn of the worker's
# GPU lock and held until each call is compared (measure.py): later calls then do not wait for
# the lock behind other evaluations' measurements while their child idles. A large task's are
# made one call at a time.
OUTPUT_SETS_AHEAD = 3


@dataclass(frozen=True)
class MemoryPlan:
    """What one evaluation of a task may hold on the GPU, on each side of the sandbox.

    The child holds the parameters, the input sets it times on (``placements``) and the new
    contents a refresh makes beside one of them, the outputs of the current call and one more
    per kept one (the previous call's, kept to detect reuse, or the copies of timed calls'
    outputs the trusted side checks), the harness's buffers (and, where the timing moves its
    local memory, what each move keeps), its CUDA context, and room for the solution's own
    workspaces. The worker holds a child to ``child_bytes``
    (``sandbox.gpu_memory``): the plan is a limit, not only an estimate. The trusted side holds
    the reference's inputs and parameters, and the outputs of ``outputs_ahead`` correctness
    calls while it compares them chunk by chunk.
    """

    child_bytes: int
    trusted_bytes: int
    large: bool
    placements: int  # input sets the child may time on at most (one for a large task)
    outputs_ahead: int = 1  # correctness calls whose reference outputs are made at once
    # False where the task's footprint could not be measured: nothing to hold a child to.
    measured: bool = True

    @property
    def total_bytes(self) -> int:
        return self.child_bytes + self.trusted_bytes


_plans: dict[tuple[str, int, int, bool], MemoryPlan] = {}
_plans_lock = threading.Lock()


def memory_plan(task: Task, timing: TimingConfig) -> MemoryPlan:
    """The plan of ``task`` at its GPU sizes, timed as ``timing`` says (its own numbers of input
    sets: a plan counted for fewer would cut the timing to them), measured once per task
    source: every evaluation of a task asks for it, and measuring loads the task and runs it on
    the meta device."""
    key = (task.hash, timing.placements, timing.most_placements, timing.move_local_memory)
    with _plans_lock:
        plan = _plans.get(key)
    if plan is None:
        plan = _measure_plan(task, timing)
        with _plans_lock:
            _plans[key] = plan
    return plan


def _measure_plan(task: Task, timing: TimingConfig) -> MemoryPlan:
    try:
        footprint = estimate_footprint(task, "cuda")
    except TaskError:
        return MemoryPlan(CHILD_OVERHEAD_BYTES, 0, False, timing.placements, measured=False)
    return plan_for(footprint.input_bytes, footprint.param_bytes, footprint.output_bytes, timing)


def plan_for(
    input_bytes: int, param_bytes: int, output_bytes: int, timing: TimingConfig
) -> MemoryPlan:
    """The plan of one forward call of these sizes, timed as ``timing`` says: on one input set
    for a large task, else on the first ``placements`` and more (up to ``most_placements``)
    while all of them fit in ``MORE_SETS_BYTES`` (see MemoryPlan)."""
    large = input_bytes + output_bytes > LARGE_TASK_BYTES
    fitting = min(timing.most_placements, MORE_SETS_BYTES // max(input_bytes, 1))
    sets = 1 if large else max(timing.placements, fitting)
    outputs = 1 + max(min(TIMED_OUTPUTS_CHECKED, sets), 1)
    ahead = 1 if large else OUTPUT_SETS_AHEAD
    workspace = max(input_bytes + output_bytes, GIB)
    moves = MOVE_BYTES * sets if timing.move_local_memory else 0
    return MemoryPlan(
        child_bytes=param_bytes
        + input_bytes * (sets + 1)
        + output_bytes * outputs
        + workspace
        + HARNESS_BYTES
        + moves
        + CHILD_OVERHEAD_BYTES,
        trusted_bytes=input_bytes + param_bytes + output_bytes * ahead,
        large=large,
        placements=sets,
        outputs_ahead=ahead,
    )


class GpuMemoryBudget:
    """Bytes of one GPU handed out to evaluations in flight; thread-safe.

    An evaluation's plan counts the CUDA context of the child it runs in: admitted first, it
    takes its child after. A child taken before its admission (one that measures the footprint
    the plan is made of) holds its context while it waits, counted by ``hold_context`` until
    the admission takes it over. The contexts of children warming for later evaluations are
    in no plan: ``for_device`` leaves them out of the capacity.

    By default (``in_order``) none is admitted before one that asked earlier, at the cost of
    memory left idle while the head of the queue waits for room. ``in_order=False`` gives
    memory to whichever waiting evaluation fits, which keeps the GPU full but lets a large one
    wait while smaller ones that asked after it are let in (at KernelBench's published sizes a
    58 GiB plan waited 23-32 s on an H100 while the next batch's smaller evaluations went
    first; in order, no first-repeat wait passed 7 s).

    ``backfill`` (with ``in_order``) lets a later evaluation start before the earliest waiting
    one where it fits beside what that one will need: what the evaluations that asked after it
    hold, the new one and the earliest one's plan together fit in the capacity. The earliest
    then waits for nothing but the evaluations that asked before it, as in order, while
    smaller ones use the memory its wait leaves idle (on an H100, a 49.8 GiB plan waiting for
    another leaves 17 GiB of the capacity in no plan). Which one is the earliest changes only
    when it starts, so no evaluation waits on arrivals after it (first-fit's starvation).
    """

    def __init__(self, capacity_bytes: int, in_order: bool = True, backfill: bool = False) -> None:
        self.capacity = capacity_bytes
        self.in_order = in_order
        self.backfill = backfill
        self.reserved = 0
        self.in_flight = 0
        self.contexts_waiting = 0
        self._changed = threading.Condition()
        self._tickets = itertools.count()
        # The acquires still waiting, in order: ticket -> what admitting it adds to ``reserved``.
        self._waiting: dict[int, int] = {}
        self._admitted: dict[int, int] = {}  # the evaluations in flight: ticket -> bytes held

    @classmethod
    def for_device(
        cls,
        device: torch.device,
        warming: int,
        fraction: float = 0.9,
        in_order: bool = True,
        backfill: bool = False,
    ) -> GpuMemoryBudget:
        """A share of the device, less the CUDA contexts of ``warming`` spare sandboxes, which
        hold memory whatever is evaluated."""
        total = torch.cuda.get_device_properties(device).total_memory
        return cls(int(total * fraction) - warming * CHILD_OVERHEAD_BYTES, in_order, backfill)

    def hold_context(self) -> Callable[[], None]:
        """Count the context of a child taken before its evaluation is admitted, at once and
        whatever the capacity (it is held already); returns the release for a child given up
        before its admission. ``acquire(..., context=)`` takes the hold over."""
        with self._changed:
            self.reserved += CHILD_OVERHEAD_BYTES
            self.contexts_waiting += 1
        return self._release_of(CHILD_OVERHEAD_BYTES, evaluations=0, contexts=1)

    def acquire(self, nbytes: int, context: Callable[[], None] | None = None) -> Callable[[], None]:
        """Wait until ``nbytes`` fit beside what is reserved (an evaluation larger than the
        whole capacity is admitted when it would run alone); returns the release, which
        gives them back once however often it is called (from any thread: a child's memory is
        free only when its reaper has seen it exit). ``context``: the ``hold_context`` of the
        child this evaluation took before, whose context ``nbytes`` counts again."""
        own = CHILD_OVERHEAD_BYTES if context is not None else 0
        with self._changed:
            ticket = next(self._tickets)
            self._waiting[ticket] = nbytes - own
            try:
                self._changed.wait_for(lambda: self._may_start(ticket))
            finally:
                del self._waiting[ticket]
                self._changed.notify_all()  # the next in order may fit now
            self.reserved += nbytes
            self.in_flight += 1
            self._admitted[ticket] = nbytes
        if context is not None:
            context()
        return self._release_of(nbytes, evaluations=1, ticket=ticket)

    def _may_start(self, ticket: int) -> bool:
        need = self._waiting[ticket]
        if not (self.reserved + need <= self.capacity or self._empty()):
            return False
        earliest = next(iter(self._waiting))
        if not self.in_order or earliest == ticket:
            return True
        if not self.backfill:
            return False
        # Room for the earliest once every evaluation that asked before it is done: what those
        # that asked after it hold, this one, its plan and the waiting children's contexts.
        after = sum(held for t, held in self._admitted.items() if t > earliest)
        contexts = self.contexts_waiting * CHILD_OVERHEAD_BYTES
        return after + need + self._waiting[earliest] + contexts <= self.capacity

    def _empty(self) -> bool:
        """No evaluation in flight and nothing held but the contexts of children waiting for
        their admission: a reservation of any size may start."""
        return self.in_flight == 0 and self.reserved == self.contexts_waiting * CHILD_OVERHEAD_BYTES

    def overdraw(self, nbytes: int) -> Callable[[], None]:
        """Count ``nbytes`` more at once, without waiting and whatever the capacity: memory
        that a retiring child holds beyond what it was admitted with, until its reaper has
        seen it exit. Admitted meanwhile, the next evaluation would find that memory still
        held and its inputs would not fit: a failure that child caused, reported as ours
        (``sandbox.gpu_memory.counted_until_exit``). Returns its release."""
        with self._changed:
            self.reserved += nbytes
        return self._release_of(nbytes, evaluations=0)

    def _release_of(
        self, nbytes: int, evaluations: int, contexts: int = 0, ticket: int | None = None
    ) -> Callable[[], None]:
        released = False

        def release() -> None:
            nonlocal released
            with self._changed:
                if released:
                    return
                released = True
                self._admitted.pop(ticket, None)
                self.reserved -= nbytes
                self.in_flight -= evaluations
                self.contexts_waiting -= contexts
                self._changed.notify_all()

        return release

    @contextlib.contextmanager
    def reserve(self, nbytes: int, context: Callable[[], None] | None = None) -> Iterator[None]:
        """``acquire`` for the length of a block."""
        release = self.acquire(nbytes, context)
        try:
            yield
        finally:
            release()
