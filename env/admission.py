"""GPU work admitted by its memory footprint.

A pool runs several evaluations on one GPU (4 by default), which suits tasks of megabytes. A
KernelBench level-1 task of 6 GiB inputs needs that much in the sandbox and again on the trusted
side (reference inputs and outputs): four at once would exhaust an 80 GiB H100 and fail as
out-of-memory errors that are nobody's fault. Each evaluation therefore reserves its estimated
footprint before it starts; a task too large to share the GPU waits until it can run alone.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

from kernelrl.env.sizes import estimate_footprint
from kernelrl.env.task import Task, TaskError

GIB = 2**30
# CUDA context, CUPTI and allocator slack of one sandbox child, beside its tensors.
CHILD_OVERHEAD_BYTES = 1 * GIB


def evaluation_bytes(task: Task) -> int:
    """GPU bytes one evaluation of ``task`` holds at its peak, on both sides of the sandbox.

    The child holds the inputs, parameters, the outputs of the current call and those of the
    previous one (kept to detect reuse); the trusted side holds the reference's inputs,
    parameters and outputs while it compares them chunk by chunk.
    """
    try:
        footprint = estimate_footprint(task, "cuda")
    except TaskError:
        return CHILD_OVERHEAD_BYTES
    data = footprint.input_bytes + footprint.param_bytes
    return 2 * data + 3 * footprint.output_bytes + CHILD_OVERHEAD_BYTES


class GpuMemoryBudget:
    """Bytes of one GPU handed out to evaluations in flight; thread-safe."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = capacity_bytes
        self.reserved = 0
        self.in_flight = 0
        self._changed = threading.Condition()

    @classmethod
    def for_device(cls, device: torch.device, fraction: float = 0.85) -> GpuMemoryBudget:
        total = torch.cuda.get_device_properties(device).total_memory
        return cls(int(total * fraction))

    @contextlib.contextmanager
    def reserve(self, nbytes: int) -> Iterator[None]:
        """Wait until ``nbytes`` fit beside what is reserved; an evaluation larger than the
        whole capacity is admitted when it would run alone."""
        with self._changed:
            self._changed.wait_for(
                lambda: self.in_flight == 0 or self.reserved + nbytes <= self.capacity
            )
            self.reserved += nbytes
            self.in_flight += 1
        try:
            yield
        finally:
            with self._changed:
                self.reserved -= nbytes
                self.in_flight -= 1
                self._changed.notify_all()
