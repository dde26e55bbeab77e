"""The GPU lock counts each thread's trusted work: how long it waited behind a measurement, how
long it held the lock, and nothing of another thread's; an evaluation takes it as few times as
its steps allow."""

import threading
import time
from pathlib import Path

import pytest

from kernelrl.env.evaluator import EvalConfig, Evaluator
from kernelrl.env.gpu_lock import GpuLock
from kernelrl.env.result import Status
from kernelrl.env.sandbox.session import SandboxSession
from kernelrl.env.task import load_task

ROOT = Path(__file__).resolve().parents[2]
RELU_TASK = load_task(ROOT / "data" / "tasks" / "01_relu.py")
RELU_SOLUTION = (ROOT / "data" / "solutions" / "triton" / "01_relu.py").read_text()


def test_trusted_work_counts_its_wait_behind_a_measurement_and_its_hold() -> None:
    lock = GpuLock()
    measuring = threading.Event()
    counted: dict[str, tuple[float, float]] = {}

    def measurement() -> None:
        with lock:  # a measurement's exclusive window: not trusted work, counted nowhere
            measuring.set()
            time.sleep(0.3)
        counted["measurement"] = lock.take_trusted_seconds()

    def trusted_work() -> None:
        measuring.wait()
        with lock.trusted():
            time.sleep(0.1)
        with lock.trusted():
            pass
        counted["trusted"] = lock.take_trusted_seconds()
        counted["after"] = lock.take_trusted_seconds()

    threads = [threading.Thread(target=measurement), threading.Thread(target=trusted_work)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    waited, held = counted["trusted"]
    assert 0.15 < waited < 0.6
    assert 0.1 <= held < 0.4
    assert counted["measurement"] == (0.0, 0.0)
    assert counted["after"] == (0.0, 0.0)  # taking the count starts the next one at zero


def test_the_reference_s_outputs_of_every_checked_call_are_made_while_the_first_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a GPU each turn of the worker's GPU work may wait behind other evaluations'
    measurements; made with the first call (the child compiling meanwhile), the reference's
    outputs leave the later calls nothing to wait for before they are compared. Each output
    is still of the seed its own call is sent, and the seeds differ."""
    evaluator = Evaluator(EvalConfig(device="cpu", timeout_s=60, spare_children=0))
    events: list[tuple[str, int]] = []
    output, send_call = evaluator.references.runner.output, SandboxSession.send_call

    def noted_output(task, model, seed):
        events.append(("output", seed))
        return output(task, model, seed)

    def noted_call(self, seed, *args, **kwargs):
        events.append(("call", seed))
        return send_call(self, seed, *args, **kwargs)

    monkeypatch.setattr(evaluator.references.runner, "output", noted_output)
    monkeypatch.setattr(SandboxSession, "send_call", noted_call)
    try:
        result = evaluator.evaluate(RELU_TASK, RELU_SOLUTION)
    finally:
        evaluator.close()
    assert result.status is Status.CORRECT, result.feedback
    seeds = [seed for kind, seed in events if kind == "call"][:3]
    assert len(set(seeds)) == 3
    made_first = [("output", seed) for seed in seeds]
    assert events[:6] == [("call", seeds[0]), *made_first, ("call", seeds[1]), ("call", seeds[2])]
