"""How many sandboxes a GPU gets, from the host's cores and memory.

On a GPU an evaluation is mostly CPU work (the child's start, the Triton compile, the
correctness calls) and only the measurement needs the GPU to itself, during which every other
child of the GPU is paused. The rate is then set by how many evaluations are in flight through
one another's pauses, bounded by the exclusive windows (at most one over the mean window), and
the children's memory bounds how many there can be. Pure arithmetic (no torch): the pools and
the benchmarks use it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

GIB = 2**30
# Per-GPU sizing when the caller asks for it (``per_gpu=AUTO``).
AUTO = 0
MIN_IN_FLIGHT = 4  # the fixed default before sizing: never fewer
MAX_IN_FLIGHT = 16
# Resident memory of one sandbox child on the host (torch with CUDA, CUPTI's buffers, a small
# task's tensors) and the share of the host the children together may take.
CHILD_HOST_BYTES = 2 * GIB
HOST_SHARE = 0.5
# Each child holds a CUDA context and CUPTI's buffers on the GPU (``admission``'s
# CHILD_OVERHEAD_BYTES); the contexts together may take this share of the device, the rest is
# for the tasks' tensors.
CHILD_GPU_BYTES = 1 * GIB
GPU_SHARE = 0.35


def check_per_gpu(per_gpu: int) -> None:
    """A one-line error for an in-flight count that is neither given nor ``AUTO``."""
    if per_gpu < AUTO:
        raise ValueError(f"per_gpu must be at least 1, or {AUTO} to size it, got {per_gpu}")


@dataclass(frozen=True)
class HostResources:
    cores: int
    host_memory_bytes: int
    gpus: int = 1
    gpu_memory_bytes: int = 80 * GIB

    @classmethod
    def detect(cls, gpus: int = 1, gpu_memory_bytes: int = 80 * GIB) -> HostResources:
        """This process's usable cores (its affinity mask) and the host's physical memory."""
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            cores = os.cpu_count() or 1
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return cls(cores, memory, max(gpus, 1), gpu_memory_bytes)


@dataclass(frozen=True)
class Sizing:
    """Per GPU: evaluations in flight (slots) and children kept warming beside them."""

    per_gpu: int
    spares: int
    why: str

    @property
    def children(self) -> int:
        return self.per_gpu + self.spares


def size_gpu_pool(host: HostResources, per_gpu: int = AUTO) -> Sizing:
    """Slots and spares for one GPU of ``host``.

    A slot per core: an evaluation keeps about a third of a core busy (the rest of its wall its
    child is paused for others' measurements or waits for the GPU), so the cores are not what
    bounds the rate; how many evaluations are in flight through one another's pauses is. A
    warming child per two slots: a child starts in about a second and a GPU finishes about four
    evaluations a second, so half as many spares as slots keep one ready for each (a slot waited
    0.02-0.2 s for one; docs/decisions.md, "Pool sizing"). Counted from the slots, not the
    cores: an explicit ``per_gpu`` below the cores would otherwise keep spares it never takes,
    whose contexts are memory the admission cannot give an evaluation. Capped so that the
    children fit in half the host's memory and their CUDA contexts in ``GPU_SHARE`` of the
    device: the spares give way first, down to ``MIN_IN_FLIGHT``. An explicit ``per_gpu`` is
    kept within that cap."""
    cores = max(host.cores // host.gpus, 1)
    by_host = int(host.host_memory_bytes * HOST_SHARE / host.gpus) // CHILD_HOST_BYTES
    by_gpu = int(host.gpu_memory_bytes * GPU_SHARE) // CHILD_GPU_BYTES
    limit = max(min(by_host, by_gpu), 2 * MIN_IN_FLIGHT)
    if per_gpu > 0:
        slots, why = per_gpu, "per_gpu given"
    else:
        slots = min(max(cores, MIN_IN_FLIGHT), MAX_IN_FLIGHT)
        why = f"{cores} cores per GPU"
    spares = max(slots // 2, MIN_IN_FLIGHT)
    if slots + spares > limit:
        spares = max(limit - slots, MIN_IN_FLIGHT)
        slots = min(slots, limit - spares)
        why += f"; capped at {limit} children by memory"
    return Sizing(slots, spares, why)
