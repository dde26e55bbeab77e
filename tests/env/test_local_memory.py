"""The local memory's move between input sets, through the driver's two limit calls as they are
spelled, checked against a driver that records them, and on a real one (GPU)."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys

import pytest
import torch

from kernelrl.data.bundled import bundled_pairs
from kernelrl.env.evaluator import EvalConfig
from kernelrl.env.pools.local import LocalPool
from kernelrl.env.result import Status
from kernelrl.env.sandbox import local_memory
from kernelrl.env.timing import TimingConfig


class FakeDriver:
    """libcuda's two limit calls as the move uses them: the stack limit read, then raised."""

    def __init__(self, stack_bytes: int, fails: str = "") -> None:
        self.stack_bytes, self.fails, self.calls = stack_bytes, fails, []

    def cuCtxGetLimit(self, value, which: int) -> int:  # noqa: N802 - the driver's name
        self.calls.append(("get", which))
        value._obj.value = self.stack_bytes
        return 1 if self.fails == "get" else 0

    def cuCtxSetLimit(self, which: int, value) -> int:  # noqa: N802 - the driver's name
        self.calls.append(("set", which, value.value))
        self.stack_bytes = value.value
        return 1 if self.fails == "set" else 0


def faked(monkeypatch, driver: FakeDriver) -> list:
    """Torch's and the driver's calls, in one list in the order they were made."""
    events = driver.calls
    monkeypatch.setattr(ctypes, "CDLL", lambda name: driver)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append("empty_cache"))

    def empty(nbytes: int, dtype, device: str) -> torch.Tensor:
        events.append(("block", nbytes, device))
        return torch.zeros(0)

    monkeypatch.setattr(torch, "empty", empty)
    return events


def test_a_new_block_is_kept_before_the_stack_limit_rises(monkeypatch) -> None:
    driver = FakeDriver(1024)
    events = faked(monkeypatch, driver)
    kept: list = []
    local_memory.move_local_memory(kept)
    local_memory.move_local_memory(kept, 4096)
    spacer = local_memory.SPACER_BYTES
    # the block first: torch makes the context current on this thread before the driver's calls
    assert events == [
        "empty_cache",
        ("block", spacer, "cuda"),
        ("get", 0),
        ("set", 0, 1040),
        "empty_cache",
        ("block", 4096, "cuda"),
        ("get", 0),
        ("set", 0, 1056),
    ]
    assert len(kept) == 2


def test_a_refused_limit_call_raises_rather_than_timing_on_unmoved_memory(monkeypatch) -> None:
    for fails in ("get", "set"):
        faked(monkeypatch, FakeDriver(1024, fails))
        with pytest.raises(RuntimeError, match="cuCtx"):
            local_memory.move_local_memory([])


def test_the_watch_says_local_memory_was_needed_only_if_a_launch_raised_the_limit(
    monkeypatch,
) -> None:
    """The limit lowered to the driver's floor (here it keeps 0), then raised by the driver at
    a launch that needs more (a spilling kernel's 376 bytes a thread): needed. No such launch:
    not needed."""
    driver = FakeDriver(1024)
    faked(monkeypatch, driver)
    spilling = local_memory.LocalMemoryWatch()
    assert driver.calls == [("set", 0, 0), ("get", 0)] and spilling.floor == 0
    driver.stack_bytes = 376  # what the driver does at the spilling kernel's launch
    assert spilling.needed()
    plain = local_memory.LocalMemoryWatch()
    assert not plain.needed()


def test_a_driver_that_refuses_the_lower_limit_leaves_the_local_memory_to_be_moved(
    monkeypatch,
) -> None:
    """Nothing then says the solution's kernels need no local memory: they are moved as every
    kernel was before the watch. A refused read afterwards is an error, not a guess."""
    faked(monkeypatch, FakeDriver(1024, "set"))
    refused = local_memory.LocalMemoryWatch()
    assert refused.floor is None and refused.needed()
    driver = FakeDriver(1024)
    faked(monkeypatch, driver)
    watch = local_memory.LocalMemoryWatch()
    driver.fails = "get"
    with pytest.raises(RuntimeError, match="cuCtxGetLimit"):
        watch.needed()


@pytest.mark.gpu
def test_on_a_gpu_an_elementwise_kernel_needs_no_local_memory_and_a_raised_limit_is_seen() -> None:
    x = torch.randn(1 << 20, device="cuda")
    watch = local_memory.LocalMemoryWatch()
    assert watch.floor is not None  # the driver took a lower limit: the watch can tell
    torch.relu(x)
    torch.cuda.synchronize()
    assert not watch.needed(), watch.floor
    local_memory.set_stack_limit(watch.floor + 1024)  # as the driver does for a spilling launch
    assert watch.needed()


@pytest.mark.gpu
def test_on_a_gpu_the_stack_limit_rises_and_kernels_run_on_the_new_local_memory() -> None:
    x = torch.randn(1 << 20, device="cuda")
    before, kept = local_memory.stack_limit(), []  # raises where the driver refuses the read
    for _ in range(3):
        local_memory.move_local_memory(kept)
        assert torch.equal(torch.relu(x), x.clamp(min=0))
    assert local_memory.stack_limit() == before + 3 * local_memory.STACK_STEP_BYTES
    assert [block.numel() for block in kept] == [local_memory.SPACER_BYTES] * 3


@pytest.mark.gpu
def test_a_spilling_convolution_is_timed_with_its_local_memory_moved_and_a_matmul_without() -> None:
    """The bundled convolution spills (376 bytes a thread for sm_90 with Triton 3.6), the
    bundled matmul does not: with the move on, only the convolution's sets are moved."""
    wanted = ("31_conv2d_stride2_relu", "18_matmul")
    pairs = [(t, s) for t, s in bundled_pairs("triton") if t.id in wanted]
    config = EvalConfig(device="cuda", timeout_s=300, timing=TimingConfig(move_local_memory=True))
    with LocalPool(config, workers=1) as pool:
        results = pool.evaluate([t for t, _ in pairs], [s for _, s in pairs])
    moved = {}
    for result in results:
        assert result.status is Status.CORRECT, result.feedback
        assert result.timing_meaningful and result.runtime is not None
        assert len(result.runtime.placement_medians_ms) >= TimingConfig().placements
        moved[result.task_id] = result.phase_seconds.get("child_local_memory_move", 0.0)
    assert moved["31_conv2d_stride2_relu"] > 0 and moved["18_matmul"] == 0, moved


# Run in its own process: the stack limit it sets leaves gigabytes of local memory behind.
REPLACEMENT_PROBE = """
import ctypes, json, torch
from kernelrl.env.sandbox.local_memory import CU_LIMIT_STACK_SIZE
cuda = ctypes.CDLL("libcuda.so.1")
STACK = 16384

def free():
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]

def replaced(stack, room):
    filler = torch.empty(free() - room, dtype=torch.uint8, device="cuda")
    code = cuda.cuCtxSetLimit(CU_LIMIT_STACK_SIZE, ctypes.c_size_t(stack))
    try:
        if code == 0:
            torch.ones(1, device="cuda").add_(1)  # a launch on the new local memory
            torch.cuda.synchronize()
    except RuntimeError as error:
        return "launch: " + str(error).splitlines()[0]
    finally:
        del filler
        torch.cuda.empty_cache()
    return code

torch.ones(1, device="cuda").add_(1)
before = free()
assert cuda.cuCtxSetLimit(CU_LIMIT_STACK_SIZE, ctypes.c_size_t(STACK)) == 0
torch.ones(1, device="cuda").add_(1)
local = before - free()  # the local memory of a 16 KiB stack a thread
half = local // 2
print(json.dumps({
    "local_bytes": local,
    "moved_with_half_free": replaced(STACK + 16, half),
    "tripled_with_half_free": replaced(3 * STACK, half),
}))
"""


@pytest.mark.gpu
def test_the_driver_gives_the_old_local_memory_back_before_it_takes_the_new() -> None:
    """What a move holds at its peak. The plan counts the local memory's rise, not a second
    local memory, which holds only if the driver frees the old one before it allocates the new.
    With half a local memory free beside it, a move of the same size then succeeds, and a
    replacement three times as large must fail (the probe does reach the driver's limit)."""
    ran = subprocess.run(
        [sys.executable, "-c", REPLACEMENT_PROBE], capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    probe = json.loads(ran.stdout.strip().splitlines()[-1])
    assert probe["local_bytes"] > 2**30, probe  # 16 KiB for every resident thread
    assert probe["tripled_with_half_free"] != 0, probe
    assert probe["moved_with_half_free"] == 0, probe
