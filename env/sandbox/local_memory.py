"""The CUDA context's local memory given up and allocated anew between a timing's input sets.

A kernel's spilled registers and its stack live in its context's local memory, which the driver
allocates once per context: every call of a process runs on one placement of it, which no input,
output or parameter placement moves. A spilling kernel (Triton convolutions spill a few hundred
bytes a thread) whose time depends on that placement therefore draws its time per process, and
an evaluation, one process, cannot average the draw away over its input sets. Raising the
stack limit makes the driver replace the local memory before the next launch; a block of new
device memory taken and kept just before sends the replacement elsewhere. Done before each
input set, the draw becomes one per set, which the sets' mean averages (``timing.time_sets``).
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


def move_local_memory(kept: list[torch.Tensor], spacer_bytes: int = SPACER_BYTES) -> None:
    """A block of ``spacer_bytes`` taken from the driver and appended to ``kept`` (held by the
    caller while the new local memory is in use), then the stack limit raised
    ``STACK_STEP_BYTES``, so that the next launch runs on local memory allocated anew."""
    torch.cuda.empty_cache()  # the block then comes from the driver, not the allocator's cache
    kept.append(torch.empty(spacer_bytes, dtype=torch.uint8, device="cuda"))
    cuda = ctypes.CDLL("libcuda.so.1")  # the calls below act on the context current here
    limit = ctypes.c_size_t()
    if cuda.cuCtxGetLimit(ctypes.byref(limit), CU_LIMIT_STACK_SIZE) != 0:
        raise RuntimeError("cuCtxGetLimit(CU_LIMIT_STACK_SIZE) failed")
    raised = ctypes.c_size_t(limit.value + STACK_STEP_BYTES)
    if cuda.cuCtxSetLimit(CU_LIMIT_STACK_SIZE, raised) != 0:
        raise RuntimeError("cuCtxSetLimit(CU_LIMIT_STACK_SIZE) failed")
