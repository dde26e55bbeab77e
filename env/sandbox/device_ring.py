"""The output ring in the GPU's own memory: two slots the worker allocates on the evaluation's
device and shares with its child by file descriptor, so that an output already on the GPU is
compared where it is, never copied through host memory.

Through the host ring (``stream.Ring``) every byte of an output crosses host memory twice, from
the child's device into a slot and from the slot into the worker's device: at KernelBench's
published sizes (6.4 GB for one ``19_ReLU`` output) that made the comparison the largest part
of an evaluation, bound by the host's memory bandwidth once several ran at once. Through this
ring the child copies each chunk device to device into a slot and the worker copies it device
to device into memory of its own.

What keeps the trusted side trusted is what keeps the host ring so:
- The worker makes the allocation (CUDA's virtual memory management: ``cuMemCreate`` with a
  POSIX file descriptor as its shareable handle) and holds its own handle and mapping until it
  closes the ring: a child can map it, write it or unmap its own view, but never free, shrink
  or move the worker's, so the worker's copies out of it cannot fault.
- The worker maps nothing the child allocated, and copies each slot into its own buffer, and
  waits for that copy, before it reads any byte or frees the slot.
- The slots' size is the worker's; the child learns it with the descriptor.
- The worker zeroes the allocation before it shares it: memory this process freed before (a
  task's expected outputs) can come back from the driver as it was left.

Where the driver cannot share device memory this way (no ``cuda.bindings``, a runtime that
refuses the export), ``offer`` returns None with the reason and the host ring carries the
bytes, as before.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

SLOTS = 2
# A device-to-device copy of one slot takes microseconds at an H100's or H200's memory bandwidth,
# so slots smaller than the host ring's cost little and keep the memory held per child small.
SLOT_BYTES = 32 * 1024 * 1024
log = logging.getLogger(__name__)
MODE_ENV = "KERNELRL_OUTPUT_RING"  # "host": never offer a device ring (the side-by-side arm)


class DeviceRingUnavailable(RuntimeError):
    """The driver could not make, share or map the ring."""


def _driver() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise DeviceRingUnavailable(f"no cuda.bindings ({exc})") from None
    return driver


def _call(name: str, *args: Any) -> Any:
    """A driver call's value, or DeviceRingUnavailable naming the call and CUDA's error."""
    driver = _driver()
    try:
        result = getattr(driver, name)(*args)
    except Exception as exc:  # noqa: BLE001 - no driver library, arguments this build refuses
        raise DeviceRingUnavailable(f"{name} failed: {exc}") from None
    error, values = result[0], result[1:]
    if error != driver.CUresult.CUDA_SUCCESS:
        raise DeviceRingUnavailable(f"{name} failed: {getattr(error, 'name', error)}")
    return values[0] if len(values) == 1 else values


def _allocation_prop(ordinal: int) -> Any:
    driver = _driver()
    prop = driver.CUmemAllocationProp()
    prop.type = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = ordinal
    prop.requestedHandleTypes = (
        driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    )
    return prop


class _Span:
    """Mapped device memory as torch reads it (``__cuda_array_interface__``), no copy."""

    def __init__(self, address: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (address, False),
            "version": 3,
            "strides": None,
            "stream": None,
        }


class DeviceRing:
    """``SLOTS`` slots of ``SLOT_BYTES`` in one device allocation, mapped into this process."""

    on_device = True
    slot_bytes = SLOT_BYTES

    def __init__(self, handle: Any, size: int, device: torch.device) -> None:
        """Map ``handle`` (this process's handle of the allocation, which the ring now owns and
        releases, also when mapping it fails)."""
        self.device = device
        self.size = size
        self._handle = handle
        self._address: Any = None
        self._mapped = False
        self.mapping: torch.Tensor | None = None
        self.slots: list[torch.Tensor] = []
        try:
            driver = _driver()
            with torch.cuda.device(device):
                torch.cuda.init()
                self._address = _call("cuMemAddressReserve", size, 0, 0, 0)
                _call("cuMemMap", self._address, size, 0, handle, 0)
                self._mapped = True
                access = driver.CUmemAccessDesc()
                access.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
                access.location.id = device.index
                access.flags = driver.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                _call("cuMemSetAccess", self._address, size, [access], 1)
                whole = torch.as_tensor(_Span(int(self._address), size), device=device)
            if whole.data_ptr() != int(self._address) or whole.device != device:
                raise DeviceRingUnavailable("torch copied the mapping instead of viewing it")
        except BaseException:
            self.close()
            raise
        self.mapping = whole
        self.slots = [whole[i * SLOT_BYTES : (i + 1) * SLOT_BYTES] for i in range(SLOTS)]

    @classmethod
    def create(cls, device: torch.device) -> DeviceRing:
        """A new ring on ``device`` (the worker's side), shareable by file descriptor."""
        device = _cuda_device(device)
        prop = _allocation_prop(device.index)
        granularity = _call(
            "cuMemGetAllocationGranularity",
            prop,
            _driver().CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
        size = -(-SLOTS * SLOT_BYTES // granularity) * granularity
        ring = cls(_call("cuMemCreate", size, prop, 0), size, device)  # released if mapping fails
        # Physical memory this process freed earlier can come back unscrubbed: a task's expected
        # outputs, say. The child gets none of it.
        stream = torch.cuda.Stream(device)  # waits on this copy alone, not the device's queue
        with torch.cuda.stream(stream):
            ring.mapping.zero_()
        stream.synchronize()
        return ring

    @classmethod
    def attach(cls, fd: int, size: int, device: torch.device) -> DeviceRing:
        """The ring a worker shared as ``fd`` of ``size`` bytes, mapped here (the child's side);
        ``fd`` is closed."""
        try:
            if size < SLOTS * SLOT_BYTES:
                raise DeviceRingUnavailable(f"ring of {size} bytes, under {SLOTS} slots")
            device = _cuda_device(device)
            kind = _driver().CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
            with torch.cuda.device(device):
                torch.cuda.init()
                handle = _call("cuMemImportFromShareableHandle", fd, kind)
        finally:
            os.close(fd)
        return cls(handle, size, device)  # released if mapping fails

    def export(self) -> int:
        """A new file descriptor of the allocation, for one child."""
        kind = _driver().CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        with torch.cuda.device(self.device):  # the calling thread's context made current
            return int(_call("cuMemExportToShareableHandle", self._handle, kind, 0))

    def close(self) -> None:
        """Unmap and release this process's handle; the memory itself goes when the last
        process holding it lets go. No copy is pending: each side waits for its copy of a
        chunk before it passes the token on, so closing (from the worker's reaper, perhaps
        while another evaluation is measured) never waits on the device. A step the driver
        refuses is logged, not raised: the memory it holds would otherwise leak unseen."""
        self.slots = []
        self.mapping = None
        steps = []
        if self._mapped:
            self._mapped = False
            steps.append(("cuMemUnmap", self._address, self.size))
        if self._address is not None:
            steps.append(("cuMemAddressFree", self._address, self.size))
            self._address = None
        if self._handle is not None:
            steps.append(("cuMemRelease", self._handle))
            self._handle = None
        try:
            with torch.cuda.device(self.device):  # the calling thread's context made current
                for name, *args in steps:
                    try:
                        _call(name, *args)
                    except DeviceRingUnavailable as exc:
                        log.warning("device output ring not freed: %s", exc)
        except Exception as exc:  # noqa: BLE001 - no CUDA left in this process to free it with
            log.warning("device output ring not freed: %s", exc)


def _cuda_device(device: torch.device) -> torch.device:
    if device.type != "cuda":
        raise DeviceRingUnavailable(f"not a CUDA device: {device}")
    return torch.device(
        "cuda", torch.cuda.current_device() if device.index is None else device.index
    )


def offer(device: str, gpu_index: int | None) -> tuple[DeviceRing | None, str]:
    """A device ring for a child that evaluates on ``device`` (the worker's GPU ``gpu_index``),
    or None and why not: not a GPU evaluation, turned off by ``KERNELRL_OUTPUT_RING=host``, the
    driver's refusal, or any other failure to make it (said, never raised: the host ring carries
    the bytes then)."""
    if not device.startswith("cuda"):
        return None, "not a GPU evaluation"
    if os.environ.get(MODE_ENV, "").strip().lower() == "host":
        return None, f"{MODE_ENV}=host"
    try:
        return DeviceRing.create(torch.device("cuda", gpu_index or 0)), ""
    except Exception as exc:  # noqa: BLE001 - an optimisation: the host ring still works
        return None, refusal(exc)


def refusal(exc: Exception) -> str:
    """Why a ring could not be made or mapped, for the evaluation's record: the driver's words,
    or the type of any other failure with its message."""
    return str(exc) if isinstance(exc, DeviceRingUnavailable) else f"{type(exc).__name__}: {exc}"
