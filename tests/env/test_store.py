"""ResultsStore: persistence, cache keys, HF datasets view, crash safety, shared timings."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from kernelrl.env.result import EvalResult, Status, TimingStats
from kernelrl.env.store import POOL_ERROR_KEY, ResultsStore, is_cacheable, solution_key
from kernelrl.env.task import load_task
from kernelrl.env.timing import TimingConfig

ROOT = Path(__file__).resolve().parents[2]
RELU = load_task(ROOT / "data" / "tasks" / "01_relu.py")
GOOD = (ROOT / "data" / "solutions" / "triton" / "01_relu.py").read_text()
VERSIONS = {"python": "3.11.0", "torch": "2.13.0", "triton": "3.9.0", "kernelrl": "0.1.0"}


def make_result(status: Status = Status.CORRECT, **extra: object) -> EvalResult:
    result = EvalResult(
        task_id=RELU.id,
        backend=RELU.backend,
        status=status,
        device="cpu",
        device_name="cpu (x86_64)",
        versions=dict(VERSIONS),
        task_hash=RELU.hash,
        solution_hash="abc",
        timestamp=1_700_000_000.0,
        phase_seconds={"total": 2.5},
        runtime=TimingStats(1.0, 0.9, 1.1, 0.8, 1.3, 10, 0.01),
    )
    for key, value in extra.items():
        setattr(result, key, value)
    return result


def test_put_get_round_trip_keeps_every_field(tmp_path: Path) -> None:
    with ResultsStore(tmp_path / "results.db") as store:
        original = make_result(speedup_vs_eager=1.7)
        store.put(RELU, GOOD, original)
        back = store.get(RELU, GOOD, "cpu (x86_64)")
        assert back == original
        (row,) = store.rows()
        assert row["task_id"] == RELU.id and row["task_hash"] == RELU.hash
        assert row["solution"] == GOOD and row["solution_hash"] == solution_key(GOOD)
        assert row["device"] == "cpu" and row["device_name"] == "cpu (x86_64)"
        assert row["status"] == "correct" and row["correct"] is True
        assert row["timestamp"] == 1_700_000_000.0 and row["total_seconds"] == 2.5
        assert '"torch": "2.13.0"' in row["versions"]


def test_cache_key_is_task_solution_device_and_versions(tmp_path: Path) -> None:
    with ResultsStore(tmp_path / "results.db") as store:
        store.put(RELU, GOOD, make_result())
        assert store.get(RELU, GOOD, "cpu (x86_64)", VERSIONS) is not None
        assert store.get(RELU, GOOD + "\n", "cpu (x86_64)") is None  # other solution
        assert store.get(RELU, GOOD, "NVIDIA H100 80GB HBM3") is None  # other device
        assert store.get(RELU.with_backend("cuda"), GOOD, "cpu (x86_64)") is None
        assert store.get(RELU, GOOD, "cpu (x86_64)", {**VERSIONS, "torch": "2.14.0"}) is None
        # The latest verdict wins.
        store.put(RELU, GOOD, make_result(Status.INCORRECT))
        assert store.get(RELU, GOOD, "cpu (x86_64)").status is Status.INCORRECT


def test_pool_failures_are_stored_but_never_served(tmp_path: Path) -> None:
    with ResultsStore(tmp_path / "results.db") as store:
        lost = make_result(Status.RUNTIME_ERROR, sandbox={POOL_ERROR_KEY: "worker_failed"})
        store.put(RELU, GOOD, lost)
        assert store.count() == 1
        assert store.get(RELU, GOOD, "cpu (x86_64)") is None


def test_harness_errors_are_stored_but_never_served(tmp_path: Path) -> None:
    """A harness_error is kernelrl's failure, not a verdict: served from the store it would make
    every rerun of that completion fail the same way without being evaluated again."""
    path = tmp_path / "results.db"
    with ResultsStore(path) as store:
        ours = make_result(Status.HARNESS_ERROR, error="outputs could not be serialised")
        store.put(RELU, GOOD, ours)
        (row,) = store.rows()
        assert row["status"] == "harness_error" and row["cacheable"] is False
        assert store.get(RELU, GOOD, "cpu (x86_64)") is None
        # An earlier real verdict is not hidden by a later harness failure.
        store.put(RELU, GOOD + "\n", make_result(Status.INCORRECT))
        store.put(RELU, GOOD + "\n", ours)
        assert store.get(RELU, GOOD + "\n", "cpu (x86_64)").status is Status.INCORRECT
        # A harness_error row marked cacheable (written by an older kernelrl) is still not served.
        store._conn().execute("UPDATE results SET cacheable = 1")
        assert store.get(RELU, GOOD, "cpu (x86_64)") is None
    assert not is_cacheable(ours)
    assert is_cacheable(make_result(Status.RUNTIME_ERROR))  # the solution's crash: a verdict
    shared = make_result(Status.CORRECT)
    shared.sandbox["gpu_shared_with"] = [1234]  # judged, but timed beside another's work
    assert is_cacheable(make_result(Status.CORRECT)) and not is_cacheable(shared)


def test_reads_back_as_hf_dataset(tmp_path: Path) -> None:
    from datasets import Dataset

    with ResultsStore(tmp_path / "results.db") as store:
        assert len(store.to_dataset()) == 0
        store.put(RELU, GOOD, make_result(speedup_vs_eager=2.0))
        store.put(RELU, "bad", make_result(Status.FORMAT_ERROR, runtime=None))
        dataset = store.to_dataset()
    assert isinstance(dataset, Dataset) and len(dataset) == 2
    assert dataset["status"] == ["correct", "format_error"]
    assert dataset["solution"] == [GOOD, "bad"]
    assert dataset.filter(lambda row: row["correct"])["speedup_vs_eager"] == [2.0]
    assert EvalResult.from_dict(__import__("json").loads(dataset[1]["result"])).runtime is None


def test_task_seconds_is_the_median_per_task(tmp_path: Path) -> None:
    with ResultsStore(tmp_path / "results.db") as store:
        for seconds in (1.0, 5.0, 3.0):
            store.put(RELU, GOOD, make_result(phase_seconds={"total": seconds}))
        assert store.task_seconds("cpu (x86_64)") == {RELU.hash: 3.0}
        assert store.task_seconds("other") == {}


def _writer(path: str, worker: int, count: int) -> None:
    store = ResultsStore(path)
    for index in range(count):
        store.put(RELU, f"{worker}-{index}", make_result())
    store.close()


def test_concurrent_writer_processes_lose_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "results.db")
    ResultsStore(path).close()
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_writer, args=(path, w, 40)) for w in range(3)]
    for process in writers:
        process.start()
    for process in writers:
        process.join(120)
        assert process.exitcode == 0
    with ResultsStore(path) as store:
        assert store.count() == 120
        assert len({row["solution"] for row in store.rows()}) == 120


def test_a_killed_run_keeps_every_finished_result(tmp_path: Path) -> None:
    """SIGKILL in the middle of a stream of writes: every put that returned is on disk."""
    path = tmp_path / "results.db"
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_store import RELU, make_result
        from kernelrl.env.store import ResultsStore
        store = ResultsStore({str(path)!r})
        index = 0
        while True:
            store.put(RELU, f"solution-{{index}}", make_result())
            print(index, flush=True)  # reported only once committed
            index += 1
        """
    )
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    reported = -1
    deadline = time.monotonic() + 60
    while reported < 50 and time.monotonic() < deadline:
        reported = int(process.stdout.readline())
    process.kill()  # SIGKILL: no atexit, no close, possibly mid-transaction
    process.wait()
    assert reported >= 50
    with ResultsStore(path) as store:
        stored = {row["solution"] for row in store.rows()}
        assert {f"solution-{i}" for i in range(reported + 1)} <= stored
        assert store.get(RELU, f"solution-{reported}", "cpu (x86_64)") is not None


def _time_in_other_process(path: str, key: str) -> None:
    ResultsStore(path).reference_timings().put(key, TimingStats(2.0, 1.9, 2.1, 1.8, 2.2, 5, 0.02))


def test_reference_timings_are_shared_through_the_store(tmp_path: Path) -> None:
    path = str(tmp_path / "results.db")
    cache = ResultsStore(path).reference_timings()
    eager = cache.key(RELU, torch.device("cpu"), "eager", TimingConfig())
    compiled = cache.key(RELU, torch.device("cpu"), "compile", TimingConfig())
    # A timing taken another way (here: to another error target) is another entry.
    other_way = cache.key(RELU, torch.device("cpu"), "eager", TimingConfig(target_rel_err=0.01))
    assert other_way != eager and cache.get(other_way) is False
    assert cache.get(eager) is False  # a miss
    process = multiprocessing.get_context("spawn").Process(
        target=_time_in_other_process, args=(path, eager)
    )
    process.start()
    process.join(120)
    assert process.exitcode == 0
    assert cache.get(eager).median_ms == 2.0  # measured by the other process, reused here
    cache.put(compiled, None)  # "no torch.compile baseline" is remembered too
    assert ResultsStore(path).reference_timings().get(compiled) is None


@pytest.mark.parametrize("payload", ["not sqlite at all", ""])
def test_unreadable_store_file_is_a_clear_error(tmp_path: Path, payload: str) -> None:
    path = tmp_path / "results.db"
    path.write_text(payload * 100)
    if not payload:  # an empty file is a valid empty database
        with ResultsStore(path) as store:
            assert store.count() == 0
        return
    with pytest.raises(ValueError, match="not a results store"):
        ResultsStore(path)


def _open_store(path: str, barrier, outcomes) -> None:  # noqa: ANN001 - multiprocessing objects
    barrier.wait()
    try:
        ResultsStore(path).reference_timings()
        outcomes.put("ok")
    except Exception as exc:  # noqa: BLE001 - the outcome is what the test checks
        outcomes.put(repr(exc)[:300])


def test_processes_opening_a_new_store_at_once_all_succeed(tmp_path: Path) -> None:
    """Ray workers open the same store as they start: SQLite refuses one of two simultaneous
    switches to WAL at once, without waiting (it failed 8 of 20 rounds of this before)."""
    context = multiprocessing.get_context("fork")
    for round_ in range(8):
        path = str(tmp_path / f"round{round_}" / "results.db")
        barrier, outcomes = context.Barrier(8), context.Queue()
        processes = [
            context.Process(target=_open_store, args=(path, barrier, outcomes)) for _ in range(8)
        ]
        for process in processes:
            process.start()
        for process in processes:
            process.join(timeout=120)
        results = [outcomes.get(timeout=5) for _ in processes]
        assert results == ["ok"] * 8, results
