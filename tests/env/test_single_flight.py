"""One producer at a time: evaluations of one task side by side time its reference once, the
others waiting for it outside every lock and then finding it cached."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from kernelrl.env.evaluator import EvalConfig, Evaluator
from kernelrl.env.reference import ReferenceRunner, ReferenceTimingCache
from kernelrl.env.result import Status
from kernelrl.env.single_flight import SingleFlight
from kernelrl.env.task import load_task

ROOT = Path(__file__).resolve().parents[2]
RELU = load_task(ROOT / "data" / "tasks" / "01_relu.py")
GOOD = (ROOT / "data" / "solutions" / "triton" / "01_relu.py").read_text()


def test_a_claim_waits_for_the_holder_of_any_of_its_keys_and_not_for_others() -> None:
    flight, order = SingleFlight(), []
    holding, release = threading.Event(), threading.Event()

    def holder() -> None:
        with flight.claim(["a", "b"], wait_s=10):
            holding.set()
            release.wait(10)
            order.append("holder done")

    def asker(keys: list[str], name: str) -> None:
        with flight.claim(keys, wait_s=10):
            order.append(name)

    threading.Thread(target=holder).start()
    holding.wait(10)
    other = threading.Thread(target=asker, args=(["c"], "other keys"))
    other.start()
    other.join(10)
    waiter = threading.Thread(target=asker, args=(["b", "c"], "same key"))
    waiter.start()
    time.sleep(0.2)
    assert order == ["other keys"]  # the one sharing a key is still waiting
    release.set()
    waiter.join(10)
    assert order == ["other keys", "holder done", "same key"]


def test_a_claim_goes_on_beside_a_holder_that_outlasts_its_wait() -> None:
    flight = SingleFlight()
    with flight.claim(["a"], wait_s=1):
        started = time.monotonic()
        with flight.claim(["a"], wait_s=0.2):
            assert 0.15 < time.monotonic() - started < 5
    with flight.claim(["a"], wait_s=0):  # both released: free again
        pass


def test_only_an_evaluator_on_a_gpu_claims_its_reference_timings() -> None:
    with Evaluator(EvalConfig(device="cpu", spare_children=0)) as evaluator:
        assert evaluator.reference_timings_in_flight is None  # nothing shared to save on a CPU


@pytest.mark.parametrize("cached", [True, False])
def test_evaluations_of_one_task_side_by_side_prepare_its_reference_timing_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cached: bool
) -> None:
    """Two evaluations of a task whose reference timing is not cached yet, at once: one
    prepares and times it, the other takes it from the cache. Timed in every evaluation
    (interleaved, the cache off) each makes its own, as before. Claims are a GPU evaluator's;
    this one on a CPU is given them, to run the same path."""
    config = EvalConfig(device="cpu", timeout_s=60, spare_children=2, cache_reference_timing=cached)
    evaluator = Evaluator(config, timing_cache=ReferenceTimingCache(tmp_path / "timings.json"))
    evaluator.reference_timings_in_flight = SingleFlight()
    prepared, timers = [], ReferenceRunner.timers

    def counted(runner, *args, **kwargs):
        prepared.append(time.monotonic())
        time.sleep(0.5)  # a published-size preparation takes seconds: the other one is waiting
        return timers(runner, *args, **kwargs)

    monkeypatch.setattr(ReferenceRunner, "timers", counted)
    results: list = [None, None]

    def evaluate(index: int) -> None:
        results[index] = evaluator.evaluate(RELU, GOOD)

    threads = [threading.Thread(target=evaluate, args=(i,)) for i in range(2)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    finally:
        evaluator.close()
    assert all(r.status is Status.CORRECT for r in results), [r.feedback for r in results]
    if cached:
        assert len(prepared) == 1
        assert results[0].ref_eager == results[1].ref_eager
        assert sum("reference_prepare" in r.phase_seconds for r in results) == 1
    else:
        assert len(prepared) == 2


@pytest.mark.gpu
def test_on_a_gpu_a_task_s_reference_is_prepared_and_timed_once_for_its_evaluations(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from kernelrl.env.pools.local import LocalPool

    monkeypatch.setenv("KERNELRL_CACHE", str(tmp_path))  # no timing cached yet
    with LocalPool(EvalConfig(device="cuda", timeout_s=300), workers=1, per_gpu=4) as pool:
        results = pool.evaluate([RELU] * 4, [GOOD] * 4)
    assert all(r.status is Status.CORRECT for r in results), [r.feedback for r in results]
    assert sum("reference_prepare" in r.phase_seconds for r in results) == 1
    assert len({(r.ref_eager.median_ms, r.ref_compile.median_ms) for r in results}) == 1
