"""The CUDA context's local memory given up and allocated anew between a timing's input sets.

A kernel's spilled registers and its stack live in its context's local memory, which the driver
allocates once per context: every call of a process runs on one placement of it, which no input,
output or parameter placement moves. A spilling kernel (Triton convolutions spill a few hundred
bytes a thread) whose time depends on that placement therefore draws its time per process, and
an evaluation, one process, cannot average the draw away over its input sets. Raising the
stack limit makes the driver replace the local memory before the next launch; a block of new
device memory taken and kept just before sends the replacement elsewhere. Done before each
input set, the draw becomes one per set, which the sets' mean averages (``timing.time_sets``).

A kernel without local memory draws nothing from its placement, and a move costs every set a
wait for the device, so the child moves only where its first call needed local memory
(``LocalMemoryWatch``).
"""

from __future__ import annotations

import ctypes

import torch

CU_LIMIT_STACK_SIZE = 0  # CUlimit
STACK_STEP_BYTES = 16  # the stack limit's rise per move: any rise makes the driver reallocate
# The block kept before each move in an evaluation's child.
SPACER_BYTES = 16 * 2**20
# What one move adds to a child's memory, counted in its plan (``admission.plan_for``) for every
# input set it may time: the kept block, and the local memory's rise (16 bytes for each of 2048
# resident threads on each of 132 SMs of an H100 or H200: 4.3 MB), with room for larger GPUs.
MOVE_BYTES = SPACER_BYTES + 8 * 2**20


def _driver() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")  # its calls act on the context current on this thread


def stack_limit() -> int:
    """The current context's per-thread stack limit in bytes, as the driver keeps it."""
    limit = ctypes.c_size_t()
    if _driver().cuCtxGetLimit(ctypes.byref(limit), CU_LIMIT_STACK_SIZE) != 0:
        raise RuntimeError("cuCtxGetLimit(CU_LIMIT_STACK_SIZE) failed")
    return limit.value


def set_stack_limit(value: int) -> None:
    """Asks for a stack limit of ``value`` bytes; the driver may round or clamp it, and waits
    for the device before it replaces the local memory."""
    if _driver().cuCtxSetLimit(CU_LIMIT_STACK_SIZE, ctypes.c_size_t(value)) != 0:
        raise RuntimeError("cuCtxSetLimit(CU_LIMIT_STACK_SIZE) failed")


def move_local_memory(kept: list[torch.Tensor], spacer_bytes: int = SPACER_BYTES) -> None:
    """A block of ``spacer_bytes`` taken from the driver and appended to ``kept`` (held by the
    caller while the new local memory is in use), then the stack limit raised
    ``STACK_STEP_BYTES``, so that the next launch runs on local memory allocated anew."""
    torch.cuda.empty_cache()  # the block then comes from the driver, not the allocator's cache
    kept.append(torch.empty(spacer_bytes, dtype=torch.uint8, device="cuda"))
    set_stack_limit(stack_limit() + STACK_STEP_BYTES)


class LocalMemoryWatch:
    """Whether the launches after it is made needed local memory: the stack limit is lowered to
    the driver's floor at once, and the driver raises it at the launch of any kernel whose
    spills and stack need more, keeping it raised (CUDA's documented behaviour of the limit),
    so a limit above the floor later says such a kernel ran. Made just before the solution's
    first call and read right after it, the harness's own kernels do not count. A driver that
    refuses the lower limit cannot tell: the local memory is then taken as needed (``floor``
    None), and moved as it would be without the watch."""

    def __init__(self) -> None:
        try:
            set_stack_limit(0)
        except RuntimeError:
            self.floor: int | None = None
        else:
            self.floor = stack_limit()

    def needed(self) -> bool:
        return self.floor is None or stack_limit() > self.floor
