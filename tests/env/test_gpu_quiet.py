"""The trusted side finds out itself whether the GPU runs a sandbox's work before it times a
solution or a reference: another process's queued kernel is seen, and a kernel left queued as
the solution's timing is reported neither slows the reference nor passes unnoticed."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from kernelrl.env.evaluator import EvalConfig, Evaluator
from kernelrl.env.gpu_claim import SHARING_UNKNOWN_KEY
from kernelrl.env.gpu_quiet import QuietProbe
from kernelrl.env.reference import ReferenceTimingCache
from kernelrl.env.result import EvalResult, Status
from kernelrl.env.sandbox.session import SandboxSession
from kernelrl.env.task import load_task

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
RELU = load_task(ROOT / "data" / "tasks" / "01_relu.py")
HONEST = (ROOT / "data" / "solutions" / "triton" / "01_relu.py").read_text()
# Another process: queues one kernel of SECONDS, says so, and waits for it.
SPINNER = """
import sys, torch
begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
begin.record()
torch.cuda._sleep(10_000_000)
end.record()
end.synchronize()
torch.cuda._sleep(int(float(sys.argv[1]) * 10_000_000 / (begin.elapsed_time(end) / 1e3)))
print("queued", flush=True)
torch.cuda.synchronize()
"""

# Another process: queues device-to-device copies of 4 GiB for about SECONDS (memcpy work, which
# copy engines may run beside another context's kernels), says so, and waits for them.
COPIER = """
import sys, torch
source = torch.zeros(4 << 30, dtype=torch.uint8, device="cuda")
target = torch.empty_like(source)
begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
begin.record()
target.copy_(source)
end.record()
end.synchronize()
for _ in range(max(1, int(float(sys.argv[1]) / (begin.elapsed_time(end) / 1e3)))):
    target.copy_(source)
print("queued", flush=True)
torch.cuda.synchronize()
"""


def _queue(script: str, seconds: float) -> subprocess.Popen:
    other = subprocess.Popen(
        [sys.executable, "-c", script, str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert other.stdout is not None and other.stdout.readline().strip() == "queued"
    return other


def _queue_a_kernel(seconds: float) -> subprocess.Popen:
    return _queue(SPINNER, seconds)


def test_the_probe_sees_another_process_s_kernel_and_its_end() -> None:
    probe = QuietProbe(torch.device("cuda"))
    assert probe.wait(1.0) is not None, f"an idle GPU judged busy (limit {probe.limit_s():.2e} s)"
    spinner = _queue_a_kernel(1.5)
    try:
        assert probe.wait(0.3) is None, f"a busy GPU judged quiet (limit {probe.limit_s():.2e} s)"
        # Another context's kernel holds back the launches: the timeout says so.
        assert probe.tally.late_launches, probe.describe_last_wait()
        waited = probe.wait(10.0)
        assert waited is not None and waited > 0.2
    finally:
        spinner.wait(timeout=60)


def test_the_probe_sees_another_process_s_copies_through_memory() -> None:
    """A memory-bound reference slows beside another context's copies even where a
    one-element kernel does not wait for them: the probe's read of memory sees them."""
    probe = QuietProbe(torch.device("cuda"))
    copier = _queue(COPIER, 3.0)
    try:
        assert probe.wait(0.3) is None, (
            f"a GPU copying through memory judged quiet (read limit {probe.read_limit_s():.2e} s)"
        )
        # Whether the copies held back the launches or only slowed the reads depends on the
        # GPU (an H200 holds back both): some probe saw them.
        assert probe.tally.late_launches or probe.tally.slow_reads, probe.describe_last_wait()
        assert probe.wait(30.0) is not None
    finally:
        copier.wait(timeout=120)


def test_a_busy_thread_of_the_worker_is_the_safe_side_and_is_named() -> None:
    """Another thread of the trusted process taking the interpreter holds up the probe's own
    launches: they count as obstructed (the GPU can delay a launch too, so a probe is never
    set aside), and the timeout says the probes were held off the CPU here."""
    probe = QuietProbe(torch.device("cuda"))
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        waited = probe.wait(0.5)
    finally:
        stop.set()
        spinner.join()
    assert waited is None and probe.tally.held_off_cpu, probe.describe_last_wait()
    assert probe.wait(1.0) is not None, probe.describe_last_wait()


def test_the_probe_calibrates_while_a_profiler_slows_this_process_s_launches() -> None:
    """CUPTI's tracing in the trusted process (a test that profiled before, say) slows every
    launch: the two reads of the first cushion no longer cover the host's queuing of the timed
    one, and calibration doubles the cushion rather than failing."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
        probe = QuietProbe(torch.device("cuda"))
        assert probe.wait(5.0) is not None, probe.describe_last_wait()


def _evaluate(
    tmp: Path, name: str, spin_s: float, monkeypatch: pytest.MonkeyPatch, **config: float
) -> EvalResult:
    """An honest ReLU, with a kernel of ``spin_s`` queued on the GPU the moment its timing
    report reaches the worker: what a solution that controls its interpreter can leave queued
    as it reports (here from another process, which the GPU cannot tell apart)."""
    evaluator = Evaluator(
        EvalConfig(device="cuda", spare_children=0, **config),
        timing_cache=ReferenceTimingCache(tmp / f"{name}.json"),
    )
    receive, spinners = SandboxSession.receive, []

    def receive_then_queue(session, *args, **kwargs):
        message = receive(session, *args, **kwargs)
        if spin_s and message.get("type") == "timing":
            spinners.append(_queue_a_kernel(spin_s))
        return message

    monkeypatch.setattr(SandboxSession, "receive", receive_then_queue)
    try:
        return evaluator.evaluate(RELU, HONEST)
    finally:
        evaluator.close()
        monkeypatch.undo()
        for spinner in spinners:
            spinner.wait(timeout=60)


def test_a_kernel_left_queued_as_the_timing_is_reported_does_not_slow_the_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = _evaluate(tmp_path, "plain", 0.0, monkeypatch)
    spun = _evaluate(tmp_path, "spun", 0.6, monkeypatch)
    assert plain.status is Status.CORRECT and spun.status is Status.CORRECT, spun.feedback
    assert plain.ref_eager is not None and spun.ref_eager is not None
    assert spun.timing_meaningful, spun.sandbox
    assert plain.phase_seconds["gpu_quiet"] < 0.5  # the probe before the solution's timing
    # Timed after the 0.6-s kernel had ended, not beside it.
    assert spun.phase_seconds["reference_timing"] > 0.4
    assert spun.ref_eager.median_ms < 1.25 * plain.ref_eager.median_ms, (
        plain.ref_eager,
        spun.ref_eager,
    )


def test_a_kernel_that_outlasts_the_wait_leaves_the_timing_unused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _evaluate(tmp_path, "long", 3.0, monkeypatch, gpu_quiet_timeout_s=0.5)
    assert result.status is Status.CORRECT, result.feedback
    assert not result.timing_meaningful
    assert result.speedup_vs_eager is None and result.ref_eager is None
    assert "not found quiet" in result.sandbox[SHARING_UNKNOWN_KEY]
    assert "not meaningful" in result.feedback
    assert not (tmp_path / "long.json").exists()  # nothing cached
