"""How many sandboxes a GPU gets, from the host's cores and memory.

On a GPU an evaluation is mostly CPU work: the child's start (``import torch``, CUDA context,
CUPTI), the Triton compile and the correctness calls all run on the host's cores, and only the
measurement (timing and profile) needs the GPU to itself. Throughput is therefore set by how
many cores are kept busy with children, not by the GPU: with a fixed 4 evaluations in flight
and 8 children warming, an H100 host of 16 cores left half of them idle and every slot waited
for a ready child. Pure arithmetic (no torch): the pools and ``benchmarks/cluster_sizing.py``
both use it.
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

    Half a core's worth of slots per core: every child is paused while another evaluation is
    measured, so more slots lengthen every evaluation and starve the spares, and do not raise
    throughput (docs/decisions.md, "Pool sizing"). One warming child per core, so that a slot
    never waits for a ready child. Capped so that the children fit in half the host's memory
    and their CUDA contexts in ``GPU_SHARE`` of the device. An explicit ``per_gpu`` is kept and
    only the spares are sized."""
    cores = max(host.cores // host.gpus, 1)
    by_host = int(host.host_memory_bytes * HOST_SHARE / host.gpus) // CHILD_HOST_BYTES
    by_gpu = int(host.gpu_memory_bytes * GPU_SHARE) // CHILD_GPU_BYTES
    limit = max(min(by_host, by_gpu), 2 * MIN_IN_FLIGHT)
    if per_gpu > 0:
        slots, why = per_gpu, "per_gpu given"
    else:
        slots = min(max(cores // 2, MIN_IN_FLIGHT), MAX_IN_FLIGHT)
        why = f"{cores} cores per GPU"
    spares = max(cores, 2 * MIN_IN_FLIGHT)
    if slots + spares > limit:  # both shrink in proportion, slots no lower than the old 4
        slots = max(slots * limit // (slots + spares), min(MIN_IN_FLIGHT, limit // 2))
        spares = max(limit - slots, 1)
        why += f"; capped at {limit} children by memory"
    return Sizing(slots, spares, why)
