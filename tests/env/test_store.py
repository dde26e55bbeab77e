"""ResultsStore: persistence, cache keys, HF datasets view, crash safety, shared timings.

A stored verdict is served again only for exactly what decided it: the task's source,
tolerances, sizes and backend (and whether it is trusted), the solution, the device, library
versions, every evaluation setting that can change a verdict, and the environment's own code.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from kernelrl.env.evaluator import EvalConfig
from kernelrl.env.result import EvalResult, Status, TimingStats
from kernelrl.env.store import POOL_ERROR_KEY, ResultsStore, is_cacheable, solution_key
from kernelrl.env.task import Task, load_task, task_from_row
from kernelrl.env.timing import TimingConfig
from kernelrl.env.verdict_key import (
    NOT_VERDICT_SETTINGS,
    NOT_VERDICT_TASK_FIELDS,
    VerdictContext,
    code_fingerprint,
    environment_fingerprint,
    evaluation_settings,
    package_root,
    verdict_key,
)

ROOT = Path(__file__).resolve().parents[2]
RELU = load_task(ROOT / "data" / "tasks" / "01_relu.py")
GOOD = (ROOT / "data" / "solutions" / "triton" / "01_relu.py").read_text()
VERSIONS = {"python": "3.11.0", "torch": "2.13.0", "triton": "3.9.0", "kernelrl": "0.1.0"}
CONTEXT = VerdictContext(
    device="cpu",
    device_name="cpu (x86_64)",
    versions=VERSIONS,
    settings=evaluation_settings(EvalConfig(device="cpu")),
    code=environment_fingerprint(),
)


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
        store.put(RELU, GOOD, original, CONTEXT)
        back = store.get(RELU, GOOD, CONTEXT)
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
        store.put(RELU, GOOD, make_result(), CONTEXT)
        assert store.get(RELU, GOOD, CONTEXT) is not None
        assert store.get(RELU, GOOD + "\n", CONTEXT) is None  # other solution
        other_gpu = dataclasses.replace(CONTEXT, device="cuda", device_name="NVIDIA H100")
        assert store.get(RELU, GOOD, other_gpu) is None
        assert store.get(RELU, GOOD, dataclasses.replace(CONTEXT, device="cuda")) is None
        assert store.get(RELU.with_backend("cuda"), GOOD, CONTEXT) is None
        newer = dataclasses.replace(CONTEXT, versions={**VERSIONS, "torch": "2.14.0"})
        assert store.get(RELU, GOOD, newer) is None
        # The latest verdict wins.
        store.put(RELU, GOOD, make_result(Status.INCORRECT), CONTEXT)
        assert store.get(RELU, GOOD, CONTEXT).status is Status.INCORRECT


def test_a_loose_tolerance_never_answers_for_a_strict_task(tmp_path: Path) -> None:
    """Tolerances and sizes a dataset row gives a task decide its verdicts: a verdict judged
    under one never answers for another."""
    row = {"id": RELU.id, "source": RELU.source}
    strict = task_from_row(row)
    loose = task_from_row({**row, "atol": 0.1, "rtol": 0.1})
    smaller = task_from_row({**row, "sizes": '{"cpu": {"batch_size": 2, "dim": 8}}'})
    with ResultsStore(tmp_path / "results.db") as store:
        store.put(loose, GOOD, make_result(), CONTEXT)
        assert store.get(loose, GOOD, CONTEXT) is not None
        assert store.get(strict, GOOD, CONTEXT) is None
        assert store.get(task_from_row({**row, "atol": 0.1}), GOOD, CONTEXT) is None  # rtol
        assert store.get(smaller, GOOD, CONTEXT) is None


def test_a_verdict_judged_with_other_settings_or_code_is_not_served(tmp_path: Path) -> None:
    unchecked = dataclasses.replace(
        CONTEXT, settings=evaluation_settings(EvalConfig(device="cpu", static_checks=False))
    )
    with ResultsStore(tmp_path / "results.db") as store:
        store.put(RELU, GOOD, make_result(), unchecked)
        assert store.get(RELU, GOOD, unchecked) is not None
        assert store.get(RELU, GOOD, CONTEXT) is None  # static checks on: judged again
        changed_checker = dataclasses.replace(unchecked, code="0" * 64)
        assert store.get(RELU, GOOD, changed_checker) is None


def _changed(value: object) -> object:
    """Another value of the same kind, for every kind a config or task field holds."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value * 2 + 1
    if isinstance(value, str):
        return "cuda" if value != "cuda" else "triton"
    if isinstance(value, TimingConfig):
        return dataclasses.replace(value, min_reps=value.min_reps + 1)
    if value is None:
        return 0.5
    if isinstance(value, dict):
        return {"cpu": {"batch_size": 2}}
    raise AssertionError(f"no other value known for {value!r}")


def test_every_setting_but_those_shown_harmless_is_in_the_key() -> None:
    """Derived from EvalConfig as a whole: a field added later is keyed until it is shown
    (in NOT_VERDICT_SETTINGS, with why) not to change verdicts."""
    base = EvalConfig(device="cpu")
    key = verdict_key(RELU, GOOD, dataclasses.replace(CONTEXT, settings=evaluation_settings(base)))
    names = [item.name for item in dataclasses.fields(EvalConfig)]
    assert set(NOT_VERDICT_SETTINGS) <= set(names)
    for name in names:
        other = dataclasses.replace(base, **{name: _changed(getattr(base, name))})
        context = dataclasses.replace(CONTEXT, settings=evaluation_settings(other))
        same = verdict_key(RELU, GOOD, context) == key
        assert same == (name in NOT_VERDICT_SETTINGS), name


def test_every_task_field_but_its_names_is_in_the_key() -> None:
    """Whatever a Task carries besides its id and report labels (tolerances, sizes, whether
    it is trusted, a field added later) separates stored verdicts."""
    task = task_from_row({"id": "t", "source": RELU.source, "level": 1})
    key = verdict_key(task, GOOD, CONTEXT)
    names = [item.name for item in dataclasses.fields(Task)]
    assert set(NOT_VERDICT_TASK_FIELDS) <= set(names)
    for name in names:
        value = getattr(task, name)
        other = task.source + "\n" if name == "source" else _changed(value)
        changed = dataclasses.replace(task, **{name: other})
        same = verdict_key(changed, GOOD, CONTEXT) == key
        assert same == (name in NOT_VERDICT_TASK_FIELDS), name


def test_an_untrusted_task_never_shares_entries_with_a_trusted_one(tmp_path: Path) -> None:
    if "trusted" not in {item.name for item in dataclasses.fields(Task)}:
        pytest.skip("Task has no 'trusted' field in this checkout")
    untrusted = dataclasses.replace(RELU, trusted=False)
    with ResultsStore(tmp_path / "results.db") as store:
        store.put(RELU, GOOD, make_result(), CONTEXT)
        assert store.get(untrusted, GOOD, CONTEXT) is None
        store.put(untrusted, GOOD + "\n", make_result(), CONTEXT)
        assert store.get(RELU, GOOD + "\n", CONTEXT) is None


def test_the_code_fingerprint_covers_the_environment_and_what_it_imports(
    tmp_path: Path,
) -> None:
    """A changed checker, or a module of the package the environment imports, never serves an
    old verdict; code the environment does not import leaves the key alone."""
    root = package_root()
    copy = tmp_path / "kernelrl"
    shutil.copytree(root / "env", copy / "env", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(root / "rewards", copy / "rewards", ignore=shutil.ignore_patterns("__pyc*"))
    for name in ("__init__.py", "progress.py", "prompts.py"):
        shutil.copy(root / name, copy / name)
    assert code_fingerprint(copy) == code_fingerprint(root) == environment_fingerprint()
    before = code_fingerprint(copy)
    for edited, counts in (
        ("env/integrity/static_checks.py", True),
        ("progress.py", True),  # imported by the environment
        ("__init__.py", True),
        ("prompts.py", False),  # imports the environment, not the other way
        ("rewards/components.py", False),
    ):
        path = copy / edited
        original = path.read_text()
        path.write_text(original + "\n# changed\n")
        assert (code_fingerprint(copy) != before) == counts, edited
        path.write_text(original)
    assert code_fingerprint(copy) == before


OLD_SCHEMA = """
CREATE TABLE results (
    id INTEGER PRIMARY KEY AUTOINCREMENT, task_id TEXT NOT NULL, task_hash TEXT NOT NULL,
    backend TEXT NOT NULL, solution_hash TEXT NOT NULL, solution TEXT NOT NULL,
    device TEXT NOT NULL, device_name TEXT NOT NULL, status TEXT NOT NULL,
    correct INTEGER NOT NULL, speedup_vs_eager REAL, speedup_vs_compile REAL,
    total_seconds REAL, versions TEXT NOT NULL, cacheable INTEGER NOT NULL,
    timestamp REAL NOT NULL, written REAL NOT NULL, result TEXT NOT NULL
);
CREATE INDEX results_key ON results (task_hash, solution_hash, device_name);
CREATE TABLE reference_timings (key TEXT PRIMARY KEY, stats TEXT, written REAL NOT NULL);
"""


def test_a_store_keyed_the_old_way_is_read_but_never_served(tmp_path: Path) -> None:
    path = tmp_path / "results.db"
    old = sqlite3.connect(path)
    old.executescript(OLD_SCHEMA)
    result = make_result()
    old.execute(
        "INSERT INTO results (task_id, task_hash, backend, solution_hash, solution, device,"
        " device_name, status, correct, versions, cacheable, timestamp, written, result)"
        " VALUES (?, ?, ?, ?, ?, 'cpu', 'cpu (x86_64)', 'correct', 1, ?, 1, 0, 0, ?)",
        (RELU.id, RELU.hash, RELU.backend, solution_key(GOOD), GOOD, "{}", result.to_json()),
    )
    old.commit()
    old.close()
    with ResultsStore(path) as store:
        assert store.count() == 1 and next(store.rows())["verdict_key"] is None
        assert store.get(RELU, GOOD, CONTEXT) is None
        store.put(RELU, GOOD, make_result(), CONTEXT)
        assert store.get(RELU, GOOD, CONTEXT) is not None
    with ResultsStore(path) as again:  # opening it again changes nothing
        assert again.count() == 2 and again.get(RELU, GOOD, CONTEXT) is not None


def test_pool_failures_are_stored_but_never_served(tmp_path: Path) -> None:
    with ResultsStore(tmp_path / "results.db") as store:
        lost = make_result(Status.RUNTIME_ERROR, sandbox={POOL_ERROR_KEY: "worker_failed"})
        store.put(RELU, GOOD, lost, CONTEXT)
        assert store.count() == 1
        assert store.get(RELU, GOOD, CONTEXT) is None


def test_harness_errors_are_stored_but_never_served(tmp_path: Path) -> None:
    """A harness_error is kernelrl's failure, not a verdict: served from the store it would make
    every rerun of that completion fail the same way without being evaluated again."""
    path = tmp_path / "results.db"
    with ResultsStore(path) as store:
        ours = make_result(Status.HARNESS_ERROR, error="outputs could not be serialised")
        store.put(RELU, GOOD, ours, CONTEXT)
        (row,) = store.rows()
        assert row["status"] == "harness_error" and row["cacheable"] is False
        assert store.get(RELU, GOOD, CONTEXT) is None
        # An earlier real verdict is not hidden by a later harness failure.
        store.put(RELU, GOOD + "\n", make_result(Status.INCORRECT), CONTEXT)
        store.put(RELU, GOOD + "\n", ours, CONTEXT)
        assert store.get(RELU, GOOD + "\n", CONTEXT).status is Status.INCORRECT
        # A harness_error row marked cacheable (written by an older kernelrl) is still not served.
        store._conn().execute("UPDATE results SET cacheable = 1")
        assert store.get(RELU, GOOD, CONTEXT) is None
    assert not is_cacheable(ours)
    assert is_cacheable(make_result(Status.RUNTIME_ERROR))  # the solution's crash: a verdict
    shared = make_result(Status.CORRECT)
    shared.sandbox["gpu_shared_with"] = [1234]  # judged, but timed beside another's work
    assert is_cacheable(make_result(Status.CORRECT)) and not is_cacheable(shared)
    unknown = make_result(Status.CORRECT)
    unknown.sandbox["gpu_sharing_unknown"] = "no GPU claim could be made"  # /dev/shm full
    assert not is_cacheable(unknown)


def test_reads_back_as_hf_dataset(tmp_path: Path) -> None:
    from datasets import Dataset

    with ResultsStore(tmp_path / "results.db") as store:
        assert len(store.to_dataset()) == 0
        store.put(RELU, GOOD, make_result(speedup_vs_eager=2.0), CONTEXT)
        store.put(RELU, "bad", make_result(Status.FORMAT_ERROR, runtime=None), CONTEXT)
        dataset = store.to_dataset()
    assert isinstance(dataset, Dataset) and len(dataset) == 2
    assert dataset["status"] == ["correct", "format_error"]
    assert dataset["solution"] == [GOOD, "bad"]
    assert dataset.filter(lambda row: row["correct"])["speedup_vs_eager"] == [2.0]
    assert EvalResult.from_dict(__import__("json").loads(dataset[1]["result"])).runtime is None


def test_task_seconds_is_the_median_per_task(tmp_path: Path) -> None:
    with ResultsStore(tmp_path / "results.db") as store:
        for seconds in (1.0, 5.0, 3.0):
            store.put(RELU, GOOD, make_result(phase_seconds={"total": seconds}), CONTEXT)
        assert store.task_seconds("cpu (x86_64)") == {RELU.hash: 3.0}
        assert store.task_seconds("other") == {}


def _writer(path: str, worker: int, count: int) -> None:
    store = ResultsStore(path)
    for index in range(count):
        store.put(RELU, f"{worker}-{index}", make_result(), CONTEXT)
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
        from test_store import CONTEXT, RELU, make_result
        from kernelrl.env.store import ResultsStore
        store = ResultsStore({str(path)!r})
        index = 0
        while True:
            store.put(RELU, f"solution-{{index}}", make_result(), CONTEXT)
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
        assert store.get(RELU, f"solution-{reported}", CONTEXT) is not None


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
    # So is one of the task at other sizes (a dataset row's): its baseline is another.
    resized = dataclasses.replace(RELU, sizes={"cpu": {"batch_size": 2, "dim": 8}})
    assert cache.key(resized, torch.device("cpu"), "eager", TimingConfig()) != eager
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


# ---------------------------------------------------------------------- through a real pool

# Correct but for 0.05 on every element: correct under atol 0.1, incorrect under the default.
OFF_BY_A_TWENTIETH = GOOD.replace("tl.maximum(x, 0.0)", "tl.maximum(x, 0.0) + 0.05")
# Correct, but reads the process id: only the static checks refuse it.
READS_PID = GOOD.replace("import torch\n", "import os\nimport torch\n", 1).replace(
    "        return relu(x)", "        os.getpid()\n        return relu(x)"
)


@pytest.fixture(scope="module")
def checked_pool():
    from kernelrl.env.pools.local import LocalPool

    with LocalPool(EvalConfig(device="cpu", timeout_s=60), workers=1) as pool:
        yield pool


def test_the_pools_tolerances_and_settings_reach_the_key(checked_pool, tmp_path: Path) -> None:
    """The failure seen: a solution judged correct under a loose tolerance was served as
    correct for the strict task, and one stored by a pool with static checks off was served to
    a pool with them on."""
    from kernelrl.env.pools.cached import CachedPool
    from kernelrl.env.pools.local import LocalPool

    assert OFF_BY_A_TWENTIETH != GOOD and READS_PID.count("os.getpid()") == 1
    row = {"id": RELU.id, "source": RELU.source, "sizes": RELU.sizes}
    loose, strict = task_from_row({**row, "atol": 0.1, "rtol": 0.0}), task_from_row(row)
    store = ResultsStore(tmp_path / "results.db")
    unchecked_config = EvalConfig(device="cpu", timeout_s=60, static_checks=False)
    with LocalPool(unchecked_config, workers=1) as unchecked:
        cached = CachedPool(unchecked, store)
        assert cached.context.settings["static_checks"] is False
        (judged,) = cached.evaluate([loose], [OFF_BY_A_TWENTIETH])
        assert judged.status is Status.CORRECT, judged.feedback
        (pid,) = cached.evaluate([RELU], [READS_PID])
        assert pid.status is Status.CORRECT, pid.feedback
    cached = CachedPool(checked_pool, store)
    (strict_verdict,) = cached.evaluate([strict], [OFF_BY_A_TWENTIETH])
    assert strict_verdict.status is Status.INCORRECT, strict_verdict.feedback
    (checked,) = cached.evaluate([RELU], [READS_PID])
    assert checked.status is Status.INTEGRITY_VIOLATION, checked.feedback
    assert (cached.hits, cached.misses) == (0, 2)
    (again,) = cached.evaluate([strict], [OFF_BY_A_TWENTIETH])  # the same question: served
    assert again.status is Status.INCORRECT and cached.hits == 1
    store.close()


def test_a_served_result_carries_the_askers_task_id(checked_pool, tmp_path: Path) -> None:
    from kernelrl.env.pools.cached import CachedPool

    store = ResultsStore(tmp_path / "results.db")
    cached = CachedPool(checked_pool, store)
    renamed = dataclasses.replace(RELU, id="relu_again")
    first, twin = cached.evaluate([RELU, renamed], [GOOD, GOOD])  # one evaluation, shared
    (later,) = cached.evaluate([renamed], [GOOD])  # from the store
    assert (first.task_id, twin.task_id, later.task_id) == (RELU.id, "relu_again", "relu_again")
    assert first.status is twin.status is later.status is Status.CORRECT
    assert (cached.hits, cached.misses) == (2, 1)
    with pytest.raises(ValueError, match="needs the EvalConfig"):
        CachedPool(cached, store)  # a pool that keeps no config is not keyed as if it had none
    store.close()
