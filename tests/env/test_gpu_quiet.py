"""The trusted side finds out itself whether the GPU runs a sandbox's work before it times a
solution or a reference: another process's queued kernel is seen, and a solution's kernel left running as it
reports its timing neither slows the reference nor passes unnoticed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernelrl.env.evaluator import EvalConfig, Evaluator
from kernelrl.env.gpu_claim import SHARING_UNKNOWN_KEY
from kernelrl.env.gpu_quiet import QuietProbe
from kernelrl.env.reference import ReferenceTimingCache
from kernelrl.env.result import EvalResult, Status
from kernelrl.env.task import load_task

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
RELU = load_task(ROOT / "data" / "tasks" / "01_relu.py")
HONEST = ROOT / "data" / "solutions" / "triton" / "01_relu.py"
LEAVES_A_KERNEL = (
    Path(__file__).parents[1] / "solutions" / "reference_timing" / "leaves_a_kernel_running.py"
)
# Another process: queues a kernel of about 1.5 s, says so, and waits for it.
SPINNER = """
import torch
begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
begin.record()
torch.cuda._sleep(10_000_000)
end.record()
end.synchronize()
torch.cuda._sleep(int(1.5 * 10_000_000 / (begin.elapsed_time(end) / 1e3)))
print("queued", flush=True)
torch.cuda.synchronize()
"""


def test_the_probe_sees_another_process_s_kernel_and_its_end() -> None:
    probe = QuietProbe(torch.device("cuda"))
    assert probe.wait(1.0) is not None, f"an idle GPU judged busy (limit {probe.limit_s():.2e} s)"
    spinner = subprocess.Popen([sys.executable, "-c", SPINNER], stdout=subprocess.PIPE, text=True)
    try:
        assert spinner.stdout is not None and spinner.stdout.readline().strip() == "queued"
        assert probe.wait(0.3) is None, f"a busy GPU judged quiet (limit {probe.limit_s():.2e} s)"
        waited = probe.wait(10.0)
        assert waited is not None and waited > 0.2
    finally:
        spinner.wait(timeout=60)


def _evaluate(source: str, tmp: Path, name: str, **config: float) -> EvalResult:
    evaluator = Evaluator(
        EvalConfig(device="cuda", static_checks=False, spare_children=0, **config),
        timing_cache=ReferenceTimingCache(tmp / f"{name}.json"),
    )
    try:
        return evaluator.evaluate(RELU, source)
    finally:
        evaluator.close()


def test_a_kernel_left_running_as_the_timing_is_reported_does_not_slow_the_reference(
    tmp_path: Path,
) -> None:
    honest = _evaluate(HONEST.read_text(), tmp_path, "honest")
    hack = _evaluate(LEAVES_A_KERNEL.read_text(), tmp_path, "hack")
    assert honest.status is Status.CORRECT and hack.status is Status.CORRECT, hack.feedback
    assert honest.ref_eager is not None and hack.ref_eager is not None
    assert hack.timing_meaningful, hack.sandbox
    assert honest.phase_seconds["gpu_quiet"] < 0.5  # the probe before the solution's timing
    # Timed after the 0.6-s kernel had ended, not beside it.
    assert hack.phase_seconds["reference_timing"] > 0.4
    assert hack.ref_eager.median_ms < 1.25 * honest.ref_eager.median_ms, (
        honest.ref_eager,
        hack.ref_eager,
    )


def test_a_kernel_that_outlasts_the_wait_leaves_the_timing_unused(tmp_path: Path) -> None:
    source = LEAVES_A_KERNEL.read_text().replace("SPIN_SECONDS = 0.6", "SPIN_SECONDS = 3.0")
    result = _evaluate(source, tmp_path, "long", gpu_quiet_timeout_s=0.5)
    assert result.status is Status.CORRECT, result.feedback
    assert not result.timing_meaningful
    assert result.speedup_vs_eager is None
    assert "still running" in result.sandbox[SHARING_UNKNOWN_KEY]
    assert "not meaningful" in result.feedback
