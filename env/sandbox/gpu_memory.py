"""The GPU memory of a sandbox child as the worker sees it, from the driver (NVML), never from
the child's own report: what holds an evaluation to the GPU memory it was admitted with, and
what shows, when a child ran out of memory, whether the device or the solution was short.

NVML names the processes holding memory on a device by process id. The worker finds its own id
in that list (it holds a CUDA context on the device), which shows the ids are those of its PID
namespace, so the child's processes, found under ``/proc``, can be looked up there. Where NVML
reports ids of another namespace (a container's host), a child's memory cannot be told apart:
the watch says so, holds no child to a share, and an out-of-memory in the child is then the
solution's unless the device was already short before its code ran.

Through the same library the worker reads the clocks a timing ran at (``GpuMemoryWatch.clocks``),
for the record of each evaluation: diagnostics, never part of a verdict.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from kernelrl.env.admission import CHILD_OVERHEAD_BYTES, GpuMemoryBudget

GIB = 2**30
_SUCCESS = 0
_INSUFFICIENT_SIZE = 7
_NOT_AVAILABLE = 2**64 - 1
_CLOCK_SM, _CLOCK_MEM = 1, 2  # nvmlClockType_t
_TEMPERATURE_GPU = 0  # nvmlTemperatureSensors_t
# NVML's reasons for clocks below their maximum (nvmlClocksEventReasons), by bit.
_HELD_DOWN = {
    0x1: "gpu_idle",
    0x2: "applications_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks",
}
# How often the worker looks while it waits for a child (an NVML query costs well under 1 ms).
CHECK_INTERVAL_S = 0.2
# The longest a retired child's memory beyond its share is waited for once it has exited.
TEARDOWN_WAIT_S = 10.0


class NvmlError(RuntimeError):
    """NVML could not be loaded or a call failed."""


class _Process(ctypes.Structure):  # nvmlProcessInfo_t (the _v2 and _v3 lists)
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class _ProcessV1(ctypes.Structure):  # nvmlProcessInfo_v1_t
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class _Memory(ctypes.Structure):  # nvmlMemory_t
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class Nvml:
    """The NVML calls the watch makes on one device, through ctypes on the driver's own library
    (``libnvidia-ml.so.1``): no Python package is needed."""

    def __init__(self, index: int) -> None:
        try:
            self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        except OSError as exc:
            raise NvmlError(f"libnvidia-ml.so.1 could not be loaded ({exc})") from exc
        self._check("nvmlInit_v2", self._function("nvmlInit_v2")())
        self.handle = ctypes.c_void_p()
        get_handle = self._function("nvmlDeviceGetHandleByIndex_v2")
        self._check("nvmlDeviceGetHandleByIndex_v2", get_handle(index, ctypes.byref(self.handle)))
        for name, info in (
            ("nvmlDeviceGetComputeRunningProcesses_v3", _Process),
            ("nvmlDeviceGetComputeRunningProcesses_v2", _Process),
            ("nvmlDeviceGetComputeRunningProcesses", _ProcessV1),
        ):
            if hasattr(self.lib, name):
                self._list, self._info, self._list_name = getattr(self.lib, name), info, name
                break
        else:
            raise NvmlError("NVML has no nvmlDeviceGetComputeRunningProcesses")

    def _function(self, name: str) -> ctypes._CFuncPtr:
        try:
            return getattr(self.lib, name)
        except AttributeError as exc:
            raise NvmlError(f"NVML has no {name}") from exc

    @staticmethod
    def _check(name: str, code: int) -> None:
        if code != _SUCCESS:
            raise NvmlError(f"{name} failed (NVML error {code})")

    def processes(self) -> dict[int, int | None]:
        """Bytes each process with a context on the device holds (None where NVML cannot say)."""
        for _ in range(4):
            count = ctypes.c_uint(0)
            code = self._list(self.handle, ctypes.byref(count), None)
            if code == _SUCCESS:
                return {}
            if code != _INSUFFICIENT_SIZE:
                self._check(self._list_name, code)
            size = count.value + 8  # room for processes that start meanwhile
            infos = (self._info * size)()
            count = ctypes.c_uint(size)
            code = self._list(self.handle, ctypes.byref(count), infos)
            if code == _SUCCESS:
                return {
                    int(info.pid): (
                        None if info.usedGpuMemory == _NOT_AVAILABLE else int(info.usedGpuMemory)
                    )
                    for info in infos[: count.value]
                }
            if code != _INSUFFICIENT_SIZE:
                self._check(self._list_name, code)
        raise NvmlError("the device's process list kept growing while it was read")

    def clocks(self) -> dict[str, int | list[str]]:
        """The SM and memory clocks (MHz), the temperature (C) and the reasons the clocks are
        held below their maximum, as the device reports them now."""
        sm, memory, temperature = ctypes.c_uint(0), ctypes.c_uint(0), ctypes.c_uint(0)
        reasons = ctypes.c_ulonglong(0)
        clock = self._function("nvmlDeviceGetClockInfo")
        self._check("nvmlDeviceGetClockInfo", clock(self.handle, _CLOCK_SM, ctypes.byref(sm)))
        self._check("nvmlDeviceGetClockInfo", clock(self.handle, _CLOCK_MEM, ctypes.byref(memory)))
        read = self._function("nvmlDeviceGetTemperature")
        self._check(
            "nvmlDeviceGetTemperature",
            read(self.handle, _TEMPERATURE_GPU, ctypes.byref(temperature)),
        )
        # Newer drivers name the reasons' call ``...ClocksEventReasons``; older ones have only
        # ``...ClocksThrottleReasons`` (newer ones keep it, deprecated).
        for call in (
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetCurrentClocksThrottleReasons",
        ):
            if hasattr(self.lib, call):
                self._check(call, getattr(self.lib, call)(self.handle, ctypes.byref(reasons)))
                break
        else:
            raise NvmlError("NVML has no nvmlDeviceGetCurrentClocksEventReasons")
        return {
            "sm_mhz": sm.value,
            "memory_mhz": memory.value,
            "temperature_c": temperature.value,
            "held_down": [name for bit, name in _HELD_DOWN.items() if reasons.value & bit],
        }

    def free(self) -> int:
        memory = _Memory()
        get_memory = self._function("nvmlDeviceGetMemoryInfo")
        self._check("nvmlDeviceGetMemoryInfo", get_memory(self.handle, ctypes.byref(memory)))
        return int(memory.free)


def _nvml_index(device: torch.device) -> int:
    """NVML's index of ``device``, which ignores ``CUDA_VISIBLE_DEVICES`` (torch maps it)."""
    return int(torch.cuda._get_nvml_device_index(device))


class GpuMemoryWatch:
    """What the worker reads of one device: the memory each process holds, the memory free."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.problem = ""
        self.nvml: Nvml | None = None
        # A context of this process on the device, with memory of its own: the evaluator makes
        # one anyway (references); here it is what NVML must list under this process's id.
        self._anchor = torch.empty(1, device=device)
        reserved = torch.cuda.memory_reserved(device)
        try:
            self.nvml = Nvml(_nvml_index(device))
            listed = self.nvml.processes()
        except (NvmlError, RuntimeError, ValueError) as exc:
            self.problem = f"NVML could not be read: {exc}"
            return
        own = listed.get(os.getpid(), -1)
        if own == -1 or (own is not None and own < reserved):
            self.problem = (
                "NVML does not list this worker under its own process id: its ids are another "
                "PID namespace's (a container seen from its host)"
            )
        elif own is None:
            self.problem = "NVML does not report the memory of each process here"

    @property
    def attributes(self) -> bool:
        """Whether the memory of a child's processes can be read here."""
        return not self.problem

    def describe(self) -> str:
        if self.attributes:
            return "nvml: each sandbox is held to the GPU memory admitted for it"
        return (
            f"not watched ({self.problem}): an out-of-memory in the sandbox is the solution's "
            "unless the device was short of its share before the solution's code ran"
        )

    def clocks(self) -> dict[str, int | list[str]]:
        """What the device runs at now (``Nvml.clocks``), read at the end of a timing so that
        speed-ups that differ between evaluations can be set beside the clocks they ran at;
        empty where NVML cannot be read (never a reason to fail an evaluation)."""
        if self.nvml is None:
            return {}
        try:
            return self.nvml.clocks()
        except NvmlError:
            return {}

    def held_by(self, pids: Iterable[int]) -> int | None:
        """GPU bytes that the processes ``pids`` hold together; None when NVML cannot attribute
        memory here or none of them holds a context on the device."""
        if not self.attributes or self.nvml is None:
            return None
        try:
            listed = self.nvml.processes()
        except NvmlError:
            return None
        held = [listed[pid] for pid in pids if pid in listed]
        if not held or any(nbytes is None for nbytes in held):
            return None
        return sum(nbytes for nbytes in held if nbytes is not None)

    def free(self) -> int | None:
        """Free bytes on the device: NVML's count, else the CUDA runtime's."""
        if self.nvml is not None:
            try:
                return self.nvml.free()
            except NvmlError:
                pass
        try:
            return int(torch.cuda.mem_get_info(self.device)[0])
        except RuntimeError:
            return None


_watches: dict[torch.device, GpuMemoryWatch] = {}
_watches_lock = threading.Lock()


def watch_for(device: torch.device) -> GpuMemoryWatch:
    """The one watch of ``device`` in this process."""
    with _watches_lock:
        if device not in _watches:
            _watches[device] = GpuMemoryWatch(device)
        return _watches[device]


@dataclass
class GpuShare:
    """The GPU memory admitted for one evaluation's child, as the worker holds it to it, and
    what the worker saw of the device before any solution code ran."""

    watch: GpuMemoryWatch
    admitted: int
    # What the device could give the child when its solution was sent (``note_before_solution``).
    before_solution: int | None = None
    # The most the driver listed for the child whenever the worker looked (``record``).
    most_held: int | None = None
    _next_check: float = 0.0

    def _held(self, pids: list[int]) -> int | None:
        held = self.watch.held_by(pids)
        if held is not None:
            self.most_held = max(held, self.most_held or 0)
        return held

    def record(self) -> dict[str, float | None]:
        """The share and the most the child was seen to hold, for the evaluation's record: how
        much of its task's memory plan a solution used, which decides how many evaluations the
        plans let share the device. Seen, not measured: the driver is asked every
        ``CHECK_INTERVAL_S`` while the worker waits, so a peak between two looks is missed."""
        most = None if self.most_held is None else round(self.most_held / GIB, 3)
        return {"admitted_gib": round(self.admitted / GIB, 3), "most_held_gib": most}

    def over_share(self, pids: Callable[[], list[int]]) -> int | None:
        """The bytes the child holds when that is more than its share; looked at no more often
        than every ``CHECK_INTERVAL_S``. ``pids`` is asked only then: walking the child's
        process tree in /proc, for every chunk of an output streamed, cost more than the chunk's
        comparison."""
        now = time.monotonic()
        if now < self._next_check:
            return None
        self._next_check = now + CHECK_INTERVAL_S
        held = self._held(pids())
        return held if held is not None and held > self.admitted else None

    def beyond(self, pids: list[int]) -> int:
        """The bytes the child holds beyond its share now (0 within it, or where NVML cannot
        tell)."""
        held = self._held(pids)
        return max(held - self.admitted, 0) if held is not None else 0

    def note_before_solution(self, pids: list[int]) -> None:
        """What the device can give the child while it runs only our code: what it holds plus
        what is free; without NVML, what is free plus the most its CUDA context holds (the
        harness emptied its allocator's cache after making the task's inputs once)."""
        held = self._held(pids)  # first: memory freed by the next read only adds to free
        free = self.watch.free()
        if free is not None:
            self.before_solution = free + (held if held is not None else CHILD_OVERHEAD_BYTES)

    def shortfall(self, pids: list[int]) -> str | None:
        """Why the device, not the solution, was short of this evaluation's share, where the
        worker can show it: the child within its share while the device cannot give it the
        rest, or the device already short before the solution's code ran. None otherwise."""
        admitted = self.admitted / GIB
        held = self._held(pids)  # first, as in note_before_solution
        free = self.watch.free() if held is not None else None
        if held is not None and held > self.admitted:
            return None  # more than its share: whatever else happened, the solution's
        if held is not None and free is not None and held + free < self.admitted:
            return (
                f"the sandbox held {held / GIB:.2f} GiB, within the {admitted:.2f} GiB admitted "
                f"for it, and the device had {free / GIB:.2f} GiB free: other work took the rest"
            )
        if self.before_solution is not None and self.before_solution < self.admitted:
            return (
                f"before the solution's code ran, the device could give this evaluation at most "
                f"{self.before_solution / GIB:.2f} GiB of the {admitted:.2f} GiB admitted for "
                "it: other work took the rest"
            )
        return None


def counted_until_exit(
    budget: GpuMemoryBudget | None,
    share: GpuShare | None,
    pids: list[int],
    release: Callable[[], None],
) -> Callable[[], None]:
    """``release`` for a child being retired, that first gives back what the child holds
    beyond its share, counted in ``budget`` from now until its reaper has seen it exit
    (``GpuMemoryBudget.overdraw``). A child that took more than it was admitted with keeps that
    memory until its exit is over, and the CUDA context's teardown takes a while: without this
    the next evaluation, admitted for its own small plan, would find the device full and fail
    making its inputs, a harness_error the other solution caused."""
    beyond = share.beyond(pids) if budget is not None and share is not None else 0
    if not beyond:
        return release
    assert budget is not None and share is not None
    give_back = budget.overdraw(beyond)

    def released() -> None:
        _wait_unlisted(share.watch, pids, TEARDOWN_WAIT_S)
        give_back()
        release()

    return released


def _wait_unlisted(watch: GpuMemoryWatch, pids: list[int], wait_s: float) -> None:
    """Until NVML lists no memory of ``pids`` (the driver may still be tearing their contexts
    down once they have exited), or ``wait_s`` has passed."""
    deadline = time.monotonic() + wait_s
    while watch.held_by(pids) and time.monotonic() < deadline:
        time.sleep(CHECK_INTERVAL_S / 4)
