"""LocalPool: the pool contract, recovery from dead children, async API, backpressure, batch
deadlines, broken tasks, harness errors (retried once, never cached)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kernelrl.env.evaluator import EvalConfig
from kernelrl.env.pools import Pool
from kernelrl.env.pools.cached import CachedPool
from kernelrl.env.pools.local import LocalPool
from kernelrl.env.pools.verdicts import HARNESS_FIRST_ERROR_KEY, HARNESS_RETRIES_KEY
from kernelrl.env.result import POOL_ERROR_KEY, EvalResult, Status
from kernelrl.env.sandbox.processes import ChildPool
from kernelrl.env.store import ResultsStore
from kernelrl.env.task import TaskError, load_task, task_from_source

ROOT = Path(__file__).resolve().parents[2]
RELU = load_task(ROOT / "data" / "tasks" / "01_relu.py")
GOOD = (ROOT / "data" / "solutions" / "triton" / "01_relu.py").read_text()
SEGFAULT = (
    Path(__file__).parents[1] / "solutions" / "dynamic" / "runtime_error__segfault.py"
).read_text()


def solution_hash(solution: str) -> str:
    return hashlib.sha256(solution.encode()).hexdigest()[:16]


@pytest.fixture(scope="module")
def pool() -> LocalPool:
    with LocalPool(EvalConfig(device="cpu", timeout_s=60), workers=1) as pool:
        yield pool


def test_local_and_cached_pools_keep_the_pool_contract(pool: LocalPool, tmp_path: Path) -> None:
    store = ResultsStore(tmp_path / "results.db")
    cached = CachedPool(pool, store)
    for candidate in (pool, cached):
        assert isinstance(candidate, Pool)
        assert candidate.device == "cpu" and candidate.device_name and candidate.versions
        assert candidate.num_slots == 1
    (result,) = cached.evaluate([RELU], [GOOD], timeout_s=300)  # every pool takes a deadline
    assert result.status is Status.CORRECT
    store.close()


def test_the_callers_config_is_left_as_it_was() -> None:
    config = EvalConfig(device="cpu", timeout_s=60)
    with LocalPool(config, workers=2) as local:
        assert local.config.spare_children == 2 and local.config is not config
    assert config == EvalConfig(device="cpu", timeout_s=60)


def test_an_in_flight_count_below_zero_is_refused_by_every_local_pool() -> None:
    """A negative count is neither a number of slots nor ``AUTO``: refused with one line before
    anything starts, by the pool in this process and by the one in a process of its own."""
    from kernelrl.env.pools.process import ProcessPool

    expected = "per_gpu must be at least 1, or 0 to size it, got -2"
    for make in (LocalPool, ProcessPool):
        with pytest.raises(ValueError, match=expected):
            make(EvalConfig(device="cpu"), per_gpu=-2)


def test_batch_deadline_answers_what_is_not_done() -> None:
    hang = (
        Path(__file__).parents[1] / "solutions" / "dynamic" / "timeout__infinite_loop.py"
    ).read_text()
    with LocalPool(EvalConfig(device="cpu", timeout_s=10), workers=1) as one_slot:
        # One slot: the hanging solution runs when the deadline passes, the good one (a later
        # batch) waits.
        (running,) = one_slot.submit([RELU], [hang], timeout_s=4)
        (waiting,) = one_slot.submit([RELU], [GOOD], timeout_s=4)
        ran, waited = running.result(timeout=60), waiting.result(timeout=60)
        assert ran.status is Status.TIMEOUT and ran.sandbox[POOL_ERROR_KEY] == "batch_timeout"
        # Never started: nothing is known about the solution, so it is not blamed for it.
        assert waited.status is Status.HARNESS_ERROR and not waited.scored
        assert waited.sandbox[POOL_ERROR_KEY] == "batch_timeout" and "deadline" in waited.error
        # The slot finishes the hanging evaluation (the sandbox's own limit), skips the one
        # already answered, and serves again.
        (after,) = one_slot.evaluate([RELU], [GOOD])
        assert after.status is Status.CORRECT and POOL_ERROR_KEY not in after.sandbox


def test_a_batch_is_taken_longest_first_and_answered_in_input_order(pool: LocalPool) -> None:
    # A task nothing measured yet: the larger source is expected to take longer.
    task = task_from_source(RELU.source + "\n# not evaluated before\n", "relu_unmeasured")
    padded = GOOD + "\n" + "# a longer text of the same kernel\n" * 200
    results = pool.evaluate([task] * 3, [GOOD, padded, GOOD])
    assert [r.solution_hash for r in results[:2]] == [solution_hash(GOOD), solution_hash(padded)]
    assert all(r.status is Status.CORRECT for r in results)
    started = [r.timestamp for r in results]
    assert started[1] < started[0] < started[2]  # one slot: the padded one first, then in order


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


def test_submit_blocks_when_queue_is_full(monkeypatch: pytest.MonkeyPatch) -> None:
    with LocalPool(EvalConfig(device="cpu", timeout_s=60), workers=1, max_pending=1) as small:
        (evaluator,) = small.evaluators
        evaluate, released = evaluator.evaluate, threading.Event()

        def held_evaluate(*args, **kwargs):  # an evaluation lasts until the test says so
            released.wait(120)
            return evaluate(*args, **kwargs)

        monkeypatch.setattr(evaluator, "evaluate", held_evaluate)
        submitted = threading.Event()

        def flood() -> None:
            small.submit([RELU] * 4, [GOOD] * 4)
            submitted.set()

        thread = threading.Thread(target=flood)
        thread.start()
        assert not submitted.wait(0.5), "submit of 4 returned at once with max_pending=1"
        released.set()
        thread.join(timeout=120)
        assert submitted.is_set()


def test_mismatched_lengths_rejected(pool: LocalPool) -> None:
    with pytest.raises(ValueError, match="2 tasks but 1 solutions"):
        pool.submit([RELU, RELU], [GOOD])


# ----------------------------------------------------------------------------- harness errors
class FlakyHarness:
    """The pool's real evaluation (a real sandboxed child runs the solution every time), whose
    first ``failures`` results are turned into the harness_error our harness reports when it
    fails after the child ran (say, the outputs could not be read back). Installed on the
    pool's Evaluator in this process: LocalPool evaluates in threads of this process. It also
    records which sandbox child each evaluation got, to prove the retry took a fresh one."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, pool: LocalPool, failures: int) -> None:
        (self.evaluator,) = pool.evaluators
        self.real_evaluate = self.evaluator.evaluate
        self.real_acquire = self.evaluator.children.acquire
        self.failures = failures
        self.calls = 0
        self.child_pids: list[int] = []
        monkeypatch.setattr(self.evaluator, "evaluate", self.evaluate)
        monkeypatch.setattr(self.evaluator.children, "acquire", self.acquire)

    def acquire(self):  # noqa: ANN201 - the sandbox's Child
        child = self.real_acquire()
        self.child_pids.append(child.process.pid)
        return child

    def evaluate(self, task, solution: str) -> EvalResult:  # noqa: ANN001
        result = self.real_evaluate(task, solution)
        self.calls += 1
        if self.calls <= self.failures:
            result.status = Status.HARNESS_ERROR
            result.error = f"injected harness failure {self.calls}: outputs not serialisable"
        return result


def test_harness_error_is_evaluated_once_more_in_a_fresh_child(
    pool: LocalPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    flaky = FlakyHarness(monkeypatch, pool, failures=1)
    (result,) = pool.evaluate([RELU], [GOOD])
    assert result.status is Status.CORRECT and result.scored  # the retry's real verdict
    assert flaky.calls == 2
    assert len(set(flaky.child_pids)) == 2  # two children: the retry starts from scratch
    assert result.sandbox[HARNESS_RETRIES_KEY] == 1
    assert "injected harness failure 1" in result.sandbox[HARNESS_FIRST_ERROR_KEY]


def test_a_second_harness_error_is_returned_marked_as_retried(
    pool: LocalPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    flaky = FlakyHarness(monkeypatch, pool, failures=10)
    (result,) = pool.evaluate([RELU], [GOOD])
    assert flaky.calls == 2, "a harness_error is retried once, not until it passes"
    assert result.status is Status.HARNESS_ERROR and not result.scored
    assert result.sandbox[HARNESS_RETRIES_KEY] == 1
    assert "injected harness failure 2" in result.error
    assert "twice" in result.error and "injected harness failure 1" in result.error


def test_cached_pool_never_serves_a_harness_error(
    pool: LocalPool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    store = ResultsStore(tmp_path / "results.db")
    cached = CachedPool(pool, store)
    flaky = FlakyHarness(monkeypatch, pool, failures=2)
    (first,) = cached.evaluate([RELU], [GOOD])
    assert first.status is Status.HARNESS_ERROR and flaky.calls == 2
    (row,) = store.rows()  # kept for the record, but not as a verdict to reuse
    assert row["status"] == "harness_error" and not row["cacheable"]
    # The rerun evaluates the completion again (our harness works now) instead of replaying
    # our failure; that real verdict is cached and served from then on.
    (second,) = cached.evaluate([RELU], [GOOD])
    assert second.status is Status.CORRECT and flaky.calls == 3
    (third,) = cached.evaluate([RELU], [GOOD])
    assert third.status is Status.CORRECT and flaky.calls == 3
    assert (cached.hits, cached.misses) == (1, 2)
    store.close()


def _state(pid: int) -> str:
    """The process state letter /proc shows ("X" once the process is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "X"


def _paused(pid: int) -> bool:
    """Whether the host shows ``pid`` stopped: state T (signals), or in a frozen cgroup v2
    (where the sandbox gives each child a cgroup; a frozen process shows state S)."""
    if _state(pid) == "T":
        return True
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        path = next(line[3:] for line in lines if line.startswith("0::"))
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
        mount = next(line.split() for line in mounts if " - cgroup2 " in line)
        events = Path(mount[4], os.path.relpath(path, mount[3]), "cgroup.events").read_text()
    except (OSError, StopIteration):
        return False
    return "frozen 1" in events.splitlines()


def _stopped(child, wait_s: float = 5.0) -> bool:
    """Whether the child is paused (``_paused``); pausing lands asynchronously."""
    deadline = time.monotonic() + wait_s
    while True:
        paused = _paused(child.process.pid)
        if paused or time.monotonic() > deadline:
            return paused
        time.sleep(0.05)


def _wait_for(condition, wait_s: float = 120.0) -> bool:
    deadline = time.monotonic() + wait_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_measurement_pauses_every_other_child() -> None:
    """Every child that may touch the GPU is paused during a measurement; one still importing
    runs on (CPU work) but is held at the gate before its CUDA context until the end."""
    children = ChildPool("cpu", spare=2, pause_importing=False)
    measured = running = None
    try:
        measured = children.acquire()
        running = children.acquire()
        assert _wait_for(lambda: not children._gated)  # the two spares are past their gate
        with children.paused_except(measured) as paused_any:
            assert paused_any
            children.spare = 3
            children.warm()  # a child spawned during the measurement
            (new,) = [c for c in children._warming if c in children._gated]
            others = [running, *(c for c in children._warming if c is not new)]
            assert len(others) == 3
            assert all(_stopped(c) for c in others)
            assert not _stopped(measured, wait_s=0.5)
            assert _wait_for(lambda: new in children._at_gate)  # imported, not paused
            assert not _stopped(new, wait_s=0.3)
            assert new in children._gated and "gate_seconds" not in new.ready_info
        assert not any(_stopped(c, wait_s=0.5) for c in others)
        assert _wait_for(lambda: new not in children._gated)  # let through once it ended
        # A paused child that is killed (its evaluation's deadline passed) really ends.
        with children.paused_except(measured):
            running.close()
        assert running.process.poll() is not None
    finally:
        for child in (measured, running):
            if child is not None:
                child.close()
        children.close()


def test_a_child_counts_the_time_it_was_held_paused_for_others() -> None:
    """What the evaluator subtracts from nothing but reports beside the child's own phases:
    a first call that took seconds of wall time may have spent them frozen."""
    children = ChildPool("cpu", spare=0)
    measured, held = children.acquire(), children.acquire()
    try:
        with children.paused_except(measured):
            time.sleep(0.4)
        with children.paused_except(measured):
            time.sleep(0.2)
        assert held.paused_seconds >= 0.6
        assert measured.paused_seconds == 0.0
        # Paused for its own evaluation (its reference timed): stopped, but not counted.
        measured.pause(for_others=False)
        assert _stopped(measured, wait_s=0.5)
        time.sleep(0.2)
        measured.resume()
        assert measured.paused_seconds == 0.0
    finally:
        measured.close()
        held.close()
        children.close()


def test_a_child_gone_mid_stream_is_reported_as_its_death() -> None:
    """A token to a child that has died (between two output chunks) says how it ended."""
    from kernelrl.env.sandbox.child_process import ChildDied
    from kernelrl.env.sandbox.stream import FREED

    children = ChildPool("cpu", spare=0)
    child = children.acquire()
    try:
        child.kill()  # every process of it, the one holding the channel included
        with pytest.raises(ChildDied, match="killed"):
            child.send_token(FREED, time.monotonic() + 30)
    finally:
        child.close()
        children.close()


def test_a_child_that_reads_no_tokens_is_killed_at_its_deadline() -> None:
    """The worker writes a token for every chunk it read; a child that reads none fills the
    channel, and the worker's write then ends at the evaluation's deadline, the child killed
    for its time limit, instead of holding the worker's thread (and its slot) for ever."""

    from kernelrl.env.sandbox.child_process import ChildDied
    from kernelrl.env.sandbox.stream import FREED

    children = ChildPool("cpu", spare=0)
    child = children.acquire()
    ended: list[BaseException] = []

    def write_until_stopped() -> None:
        deadline = time.monotonic() + 2.0
        try:
            while True:
                child.send_token(FREED, deadline)
        except BaseException as exc:  # noqa: BLE001 - what ended it is the finding
            ended.append(exc)

    try:
        child.pause()  # reads nothing from now on
        writer = threading.Thread(target=write_until_stopped, daemon=True)
        started = time.monotonic()
        writer.start()
        writer.join(timeout=30)
        assert ended, "the write never ended"
        assert isinstance(ended[0], ChildDied) and ended[0].timed_out, ended[0]
        assert 2.0 <= time.monotonic() - started < 10
        assert child.process.wait(timeout=15) is not None
    finally:
        child.close()
        children.close()


# A worker that holds two sandbox children, one of them paused as during another's measurement.
_DYING_WORKER = """
import time
from kernelrl.env.sandbox.processes import ChildPool
children = ChildPool("cpu", spare=0)
running, paused = children.acquire(), children.acquire()
paused.pause()
print(running.process.pid, paused.process.pid, flush=True)
time.sleep(600)
"""


def test_children_die_with_their_worker_even_paused() -> None:
    """However its worker dies (here SIGKILL, as Ray's force kill or the OOM killer), no child
    outlives it to hold the GPU or answer for a dead evaluation; a stopped one included."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    worker = subprocess.Popen(
        [sys.executable, "-c", _DYING_WORKER], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        pids = [int(pid) for pid in worker.stdout.readline().split()]
        assert len(pids) == 2 and all(_state(pid) not in "XZ" for pid in pids)
        assert _paused(pids[1])
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
        deadline = time.monotonic() + 10
        while any(_state(pid) not in "XZ" for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [_state(pid) in "XZ" for pid in pids] == [True, True]
    finally:
        worker.kill()
        worker.wait()


def test_a_child_outlives_the_thread_that_asked_for_it() -> None:
    """The death signal follows the thread that forked a child: children must not be forked
    by an evaluation's thread, or they would die when that thread ends."""
    children = ChildPool("cpu", spare=0)
    acquired = []
    asker = threading.Thread(target=lambda: acquired.append(children.acquire()))
    asker.start()
    asker.join()
    (child,) = acquired
    try:
        time.sleep(0.5)
        assert child.process.poll() is None
    finally:
        child.close()
        children.close()
