"""LocalPool: recovery from dead children, async API, backpressure, broken tasks."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from kernelrl.env.evaluator import EvalConfig
from kernelrl.env.pool import LocalPool
from kernelrl.env.result import Status
from kernelrl.env.task import TaskError, load_task, task_from_source

ROOT = Path(__file__).resolve().parent.parent
RELU = load_task(ROOT / "data" / "tasks" / "01_relu.py")
GOOD = (ROOT / "data" / "solutions" / "triton" / "01_relu.py").read_text()
SEGFAULT = (
    Path(__file__).parent / "solutions" / "dynamic" / "runtime_error__segfault.py"
).read_text()


@pytest.fixture(scope="module")
def pool() -> LocalPool:
    with LocalPool(EvalConfig(device="cpu", timeout_s=60), workers=1) as pool:
        yield pool


def test_slot_survives_a_crashing_child(pool: LocalPool) -> None:
    results = pool.evaluate([RELU, RELU, RELU], [SEGFAULT, GOOD, SEGFAULT])
    assert [r.status for r in results] == [
        Status.RUNTIME_ERROR,
        Status.CORRECT,
        Status.RUNTIME_ERROR,
    ]


def test_async_evaluate(pool: LocalPool) -> None:
    results = asyncio.run(pool.aevaluate([RELU], ["```python\n" + GOOD + "```"]))
    assert results[0].status is Status.CORRECT


def test_broken_task_fails_its_future_only(pool: LocalPool) -> None:
    broken = task_from_source(
        RELU.source.replace("return torch.relu(x)", "return torch.relu(y)"), "broken"
    )
    futures = pool.submit([broken, RELU], [GOOD, GOOD])
    with pytest.raises(TaskError, match="reference fails to run"):
        futures[0].result()
    assert futures[1].result().status is Status.CORRECT


def test_submit_blocks_when_queue_is_full() -> None:
    with LocalPool(EvalConfig(device="cpu", timeout_s=60), workers=1, max_pending=1) as small:
        submitted = threading.Event()

        def flood() -> None:
            small.submit([RELU] * 4, [GOOD] * 4)
            submitted.set()

        thread = threading.Thread(target=flood)
        thread.start()
        assert not submitted.wait(0.5), "submit of 4 returned at once with max_pending=1"
        thread.join(timeout=120)
        assert submitted.is_set()


def test_mismatched_lengths_rejected(pool: LocalPool) -> None:
    with pytest.raises(ValueError, match="2 tasks but 1 solutions"):
        pool.submit([RELU, RELU], [GOOD])
