"""RayPool on a local Ray cluster with logical GPUs (CPU workers, Triton interpreter).

The scheduling decisions themselves are tested without Ray in test_pool_scheduler.py; here the
pool runs them against real actors that really die, hang and restart.

One pool (2 workers x 2 slots, one pre-check CPU actor) is shared by the whole module: Ray and
worker start-up cost seconds each. Static checks are off in this pool (as in the sandbox tests)
so that solutions which attack the worker itself reach the sandbox: that is what the fault
tolerance must survive. The tests run in file order and leave the pool usable for the next.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import wait
from pathlib import Path

import pytest

from kernelrl.env.evaluator import EvalConfig
from kernelrl.env.pools import Pool
from kernelrl.env.pools.cached import CachedPool
from kernelrl.env.pools.ray import RayPool
from kernelrl.env.pools.sizing import AUTO, HostResources, size_gpu_pool
from kernelrl.env.pools.verdicts import HARNESS_FIRST_ERROR_KEY, HARNESS_RETRIES_KEY
from kernelrl.env.result import POOL_ERROR_KEY, EvalResult, Status
from kernelrl.env.store import ResultsStore
from kernelrl.env.task import TaskError, load_task, task_from_source

ray = pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[2]
DYNAMIC = Path(__file__).parents[1] / "solutions" / "dynamic"
RELU = load_task(ROOT / "data" / "tasks" / "01_relu.py")
GOOD = (ROOT / "data" / "solutions" / "triton" / "01_relu.py").read_text()
HANG = (DYNAMIC / "timeout__infinite_loop.py").read_text()
SEGFAULT = (DYNAMIC / "runtime_error__segfault.py").read_text()
OS_EXIT = (DYNAMIC / "runtime_error__os_exit.py").read_text()
# The same kernel, slow to build: keeps its slot busy for seconds, so that a test can see work
# in flight or queued (forked sandbox children evaluate GOOD in a fraction of a second).
SLOW_GOOD = "import time\n" + GOOD.replace(
    "        super().__init__()\n", "        super().__init__()\n        time.sleep(3)\n", 1
)
assert SLOW_GOOD.count("time.sleep(3)") == 1
# Kills the process that started its sandbox child: the worker actor itself.
KILLER = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n" + GOOD
# A task whose module refuses to load inside the sandbox (where KERNELRL_DEVICE is set) but
# loads on the trusted side: the harness fails, never the solution - a real harness_error.
SANDBOX_REFUSED = task_from_source(
    'import os\nif "KERNELRL_DEVICE" in os.environ:\n'
    '    raise RuntimeError("this task does not load in a sandbox")\n' + RELU.source,
    "sandbox_refused",
)
# Long enough that, on a loaded 2-core CI box, the five other solutions of the mixed batch
# (three sandbox children in a row on one slot) finish before the hanging one times out.
TIMEOUT_S = 40.0


def variant(source: str, tag: str) -> str:
    """Same code, another text: another cache key, so nothing is served from a cache."""
    return f"{source}\n# {tag}\n"


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("ray_pool") / "results.db")


@pytest.fixture(scope="module")
def pool(store_path: str) -> RayPool:
    config = EvalConfig(device="cpu", timeout_s=TIMEOUT_S, static_checks=False)
    with RayPool(
        config,
        workers=2,
        per_gpu=2,
        precheck_workers=1,
        max_retries=1,
        store_path=store_path,
        eval_margin_s=60,
    ) as pool:
        yield pool


@pytest.fixture(autouse=True)
def pool_log(caplog: pytest.LogCaptureFixture) -> None:
    """A failing test shows the pool's worker life (deaths, replacements, returns)."""
    caplog.set_level(logging.INFO, logger="kernelrl.env.pools.ray")


def worker_states(pool: RayPool) -> list[dict]:
    return [w for w in pool.stats()["workers"] if w["kind"] == "gpu"]


def wait_until(predicate, timeout_s: float = 120.0, pool: RayPool | None = None) -> None:
    """Poll until ``predicate()``; on a timeout, say what the pool looked like."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            state = pool.stats() if pool is not None else None
            raise AssertionError(f"condition not reached in {timeout_s:.0f} s; pool: {state}")
        time.sleep(0.05)


def test_local_pool_interface_and_parallel_workers(pool: RayPool) -> None:
    assert isinstance(pool, Pool) and pool.num_slots == 4 and pool.device == "cpu"
    assert ray.cluster_resources()["GPU"] == 2  # logical GPUs, one actor each
    before = [w["completed"] for w in worker_states(pool)]
    solutions = [variant(GOOD, f"parallel {i}") for i in range(4)]
    futures = pool.submit([RELU] * 4, solutions)
    results = [f.result(timeout=300) for f in futures]
    assert [r.status for r in results] == [Status.CORRECT] * 4
    assert all(r.versions["triton"] and r.device_name for r in results)
    after = [w["completed"] for w in worker_states(pool)]
    assert all(a > b for a, b in zip(after, before, strict=True)), "one worker did all the work"
    # The evaluations ran at the same time, not one after another.
    spans = sorted((r.timestamp, r.timestamp + r.phase_seconds["total"]) for r in results)
    assert any(spans[i + 1][0] < spans[i][1] for i in range(len(spans) - 1))

    completion = "Here is my kernel:\n```python\n" + GOOD + "```\n"
    (result,) = asyncio.run(pool.aevaluate([RELU], [completion]))
    assert isinstance(result, EvalResult) and result.status is Status.CORRECT

    with pytest.raises(ValueError, match="2 tasks but 1 solutions"):
        pool.submit([RELU, RELU], [GOOD])
    broken = task_from_source(RELU.source.replace("torch.relu(x)", "torch.relu(y)"), "broken")
    futures = pool.submit([broken, RELU], [GOOD, variant(GOOD, "next to broken")])
    with pytest.raises(TaskError, match="reference fails to run"):
        futures[0].result(timeout=300)
    assert futures[1].result(timeout=300).status is Status.CORRECT


def test_format_errors_never_reach_a_gpu_worker(pool: RayPool) -> None:
    rejected = pool.stats()["precheck_rejected"]
    (result,) = pool.evaluate([RELU], ["I could not write a kernel for this, sorry."])
    assert result.status is Status.FORMAT_ERROR and result.feedback
    assert pool.stats()["precheck_rejected"] == rejected + 1


def test_precheck_worker_runs_the_static_checks(pool: RayPool) -> None:
    from kernelrl.env.pools.ray_workers import PrecheckWorker

    where = (pool.device, pool.device_name, pool.versions)
    checker = ray.remote(PrecheckWorker).options(num_cpus=0).remote(True, where)
    fallback = GOOD.replace("return relu(x)", "return torch.relu(x)")
    verdict = ray.get(checker.check.remote(RELU, fallback))
    assert (
        verdict.status is Status.INTEGRITY_VIOLATION and "torch_fallback" in verdict.checks_failed
    )
    assert verdict.device_name == pool.device_name and verdict.feedback  # the Evaluator's own
    assert ray.get(checker.check.remote(RELU, GOOD)) is None
    ray.kill(checker)


def test_a_harness_error_is_evaluated_once_more_and_never_cached(
    pool: RayPool, store_path: str
) -> None:
    store = ResultsStore(store_path)
    cached = CachedPool(pool, store)
    retried = pool.stats()["harness_retried"]
    (result,) = cached.evaluate([SANDBOX_REFUSED], [variant(GOOD, "harness")])
    assert result.status is Status.HARNESS_ERROR and not result.scored
    assert pool.stats()["harness_retried"] == retried + 1  # once, not until it passes
    assert result.sandbox[HARNESS_RETRIES_KEY] == 1
    assert "does not load in a sandbox" in result.sandbox[HARNESS_FIRST_ERROR_KEY]
    assert "twice" in result.error
    # Stored for the record, never served: the same pair is evaluated again (and retried).
    (again,) = cached.evaluate([SANDBOX_REFUSED], [variant(GOOD, "harness")])
    assert again.status is Status.HARNESS_ERROR and cached.misses == 2 and cached.hits == 0
    assert pool.stats()["harness_retried"] == retried + 2
    store.close()


def test_hanging_and_crashing_solutions_do_not_stall_the_batch(pool: RayPool) -> None:
    goods = [variant(SLOW_GOOD, f"mixed {i}") for i in range(3)]
    solutions = [HANG, goods[0], SEGFAULT, goods[1], OS_EXIT, goods[2]]
    started = time.monotonic()
    futures = pool.submit([RELU] * len(solutions), solutions)
    finished: dict[int, float] = {}
    for index, future in enumerate(futures):
        future.add_done_callback(lambda _, i=index: finished.setdefault(i, time.monotonic()))
    # A batch deadline answers what is not done by then and leaves the rest alone. This one
    # waits behind the whole batch: nothing is known about it, so it is an (unscored)
    # harness_error, not a timeout of its solution.
    (waiting_future,) = pool.submit([RELU], [variant(GOOD, "waits")], timeout_s=0.5)
    waited = waiting_future.result(timeout=60)
    assert waited.status is Status.HARNESS_ERROR and not waited.scored
    assert waited.sandbox[POOL_ERROR_KEY] == "batch_timeout"

    results = [f.result(timeout=300) for f in futures]
    elapsed = time.monotonic() - started
    statuses = [r.status for r in results]
    assert statuses == [
        Status.TIMEOUT,
        Status.CORRECT,
        Status.RUNTIME_ERROR,
        Status.CORRECT,
        Status.RUNTIME_ERROR,
        Status.CORRECT,
    ]
    assert "SIGSEGV" in results[2].error
    # The good ones did not wait for the hanging one, and the batch ended with its timeout.
    assert max(finished[i] for i in (1, 3, 5)) < finished[0]
    assert elapsed < TIMEOUT_S + 40, f"batch took {elapsed:.0f} s"
    # One that is running when its deadline passes is answered then as a timeout; it runs on
    # (the sandbox ends it) and its late verdict is dropped.
    started = time.monotonic()
    (deadline_future,) = pool.submit([RELU], [variant(HANG, "deadline")], timeout_s=3)
    deadline_result = deadline_future.result(timeout=60)
    assert deadline_result.status is Status.TIMEOUT
    assert deadline_result.sandbox[POOL_ERROR_KEY] == "batch_timeout"
    assert time.monotonic() - started < TIMEOUT_S
    assert all(w["state"] == "ok" for w in worker_states(pool))  # no worker was lost


def test_killed_workers_lose_no_evaluation_and_count_none_twice(
    pool: RayPool, store_path: str
) -> None:
    store = ResultsStore(store_path)
    cached = CachedPool(pool, store)
    rows_before = store.count()
    stats_before = pool.stats()
    pids_before = [w["pid"] for w in worker_states(pool)]
    solutions = [variant(SLOW_GOOD, f"kill {i}") for i in range(6)]
    futures = cached.submit([RELU] * len(solutions), solutions)

    # Mid-batch, while both have work: worker 0 is killed and restarted by Ray, worker 1 is
    # killed for good (no_restart) and replaced by the pool. Both at once, so that no retry
    # can land on a worker that the test then kills (that would be a second, real death).
    wait_until(lambda: all(w["in_flight"] > 0 for w in worker_states(pool)), pool=pool)
    ray.kill(pool.actor(0), no_restart=False)
    ray.kill(pool.actor(1), no_restart=True)

    done, not_done = wait(futures, timeout=300)
    assert not not_done
    results = [f.result() for f in futures]
    assert [r.status for r in results] == [Status.CORRECT] * 6, [r.error for r in results]
    stats = pool.stats()
    assert stats["worker_deaths"] - stats_before["worker_deaths"] == 2
    assert stats["retried"] > stats_before["retried"]
    assert stats["completed"] - stats_before["completed"] == 6
    assert store.count() - rows_before == 6  # every evaluation exactly once
    assert {r["solution"] for r in list(store.rows())[rows_before:]} == set(solutions)
    wait_until(lambda: all(w["state"] == "ok" for w in worker_states(pool)), pool=pool)
    pids_after = [w["pid"] for w in worker_states(pool)]
    assert all(a != b for a, b in zip(pids_after, pids_before, strict=True))
    store.close()


def test_a_solution_that_kills_its_worker_is_a_runtime_error(pool: RayPool) -> None:
    deaths = pool.stats()["worker_deaths"]
    goods = [variant(GOOD, f"beside killer {i}") for i in range(2)]
    results = pool.evaluate([RELU] * 3, [goods[0], KILLER, goods[1]])
    if "own pid namespace" in results[0].sandbox.get("isolation", ""):
        # In its own PID namespace the solution's parent is the namespace's init, which ignores
        # the signal: the worker is out of its reach, so the solution is judged on its kernel.
        assert [r.status for r in results] == [Status.CORRECT] * 3
        assert pool.stats()["worker_deaths"] == deaths
        return
    assert [r.status for r in results] == [Status.CORRECT, Status.RUNTIME_ERROR, Status.CORRECT]
    killer = results[1]
    assert killer.sandbox[POOL_ERROR_KEY] == "worker_failed" and killer.sandbox["attempts"] == 2
    assert "worker was lost 2 times" in killer.error and "kills" in killer.error
    assert killer.error.count(") died: ") == 2  # each death with Ray's own cause
    assert pool.stats()["worker_deaths"] - deaths == 2
    # Nothing is queued now, yet the pool keeps pinging both killed workers until they serve
    # again (it once stopped at the first ping that found one still restarting).
    wait_until(lambda: all(w["state"] == "ok" for w in worker_states(pool)), pool=pool)


def test_results_store_serves_repeats_and_shares_reference_timings(
    pool: RayPool, store_path: str
) -> None:
    from datasets import Dataset

    store = ResultsStore(store_path)
    cached = CachedPool(pool, store)
    submitted = pool.stats()["submitted"]
    repeat = variant(SLOW_GOOD, "kill 0")  # evaluated in the kill test
    fresh = variant(GOOD, "cache fresh")
    results = cached.evaluate([RELU] * 4, [repeat, fresh, fresh, repeat])
    assert [r.status for r in results] == [Status.CORRECT] * 4
    assert pool.stats()["submitted"] - submitted == 1  # one new evaluation, shared in flight
    assert (cached.hits, cached.misses) == (3, 1)
    # A verdict of the pool itself (worker lost) is stored but never served again.
    killer = store.get(RELU, KILLER, cached.context)
    assert killer is None or killer.status is Status.CORRECT  # correct where it cannot kill

    dataset = store.to_dataset()
    assert isinstance(dataset, Dataset)
    row = dataset.filter(lambda r: r["solution"] == fresh)[0]
    assert row["task_id"] == "01_relu" and row["device"] == "cpu" and row["status"] == "correct"
    assert '"triton"' in row["versions"] and row["timestamp"] > 0
    # The workers timed the reference once, through the store, for all of them.
    assert any(key.startswith(RELU.hash) for key in store.timing_keys())
    store.close()


def test_status_snapshot_and_close(pool: RayPool) -> None:
    # Three evaluations in flight at once need both workers serving.
    wait_until(lambda: all(w["state"] == "ok" for w in worker_states(pool)), pool=pool)
    stats = pool.stats()
    assert stats["queued"] == 0 and stats["in_flight"] == 0
    assert stats["completed"] == stats["submitted"]
    assert stats["throughput_per_s"] > 0 and stats["device_name"] == pool.device_name
    goods = pool.submit([RELU] * 2, [variant(SLOW_GOOD, f"close {i}") for i in range(2)])
    (hung,) = pool.submit([RELU], [variant(HANG, "close")])
    wait_until(lambda: pool.stats()["in_flight"] == 3, pool=pool)
    started = time.monotonic()
    pool.close(timeout_s=20)  # lets running work finish until then (the hang never does)
    assert time.monotonic() - started < 30
    assert all(f.done() and f.result().status is Status.CORRECT for f in goods)
    closed = hung.result(timeout=0)
    # Never finished because of the pool, not the solution: a harness_error, unscored.
    assert closed.status is Status.HARNESS_ERROR and closed.sandbox[POOL_ERROR_KEY] == "closed"
    assert "closed" in closed.error and closed.feedback and closed.device_name == pool.device_name
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit([RELU], [GOOD])
    assert not ray.is_initialized()  # the pool started this Ray instance, and stopped it


def test_a_worker_that_stops_answering_is_restarted_and_its_job_blamed() -> None:
    """Runs after the module's pool closed (it needs the logical GPU). The pool sees a worker
    that does not answer within ``timeout_s + eval_margin_s`` as stuck: here a negative margin
    makes a solution hanging inside its (longer) sandbox limit look like that. The pool kills
    the worker, Ray restarts it, the job reruns alone and is given up as a timeout."""
    config = EvalConfig(device="cpu", timeout_s=60, static_checks=False)
    with RayPool(config, workers=1, per_gpu=2, max_retries=1, eval_margin_s=-40) as stuck:
        pid = worker_states(stuck)[0]["pid"]
        hang, good = stuck.submit([RELU, RELU], [variant(HANG, "stuck"), variant(GOOD, "stuck")])
        assert good.result(timeout=300).status is Status.CORRECT
        result = hang.result(timeout=300)
        assert result.status is Status.TIMEOUT and result.sandbox[POOL_ERROR_KEY] == "worker_failed"
        assert result.error.count("did not answer within 20 s") == 2
        stats = stuck.stats()
        assert stats["eval_timeouts"] == 2 and stats["worker_deaths"] == 2
        wait_until(lambda: worker_states(stuck)[0]["state"] == "ok", pool=stuck)
        assert worker_states(stuck)[0]["pid"] != pid  # a restarted process serves now


def test_each_actor_sizes_its_slots_from_its_own_node() -> None:
    """Runs after the module's pool closed (it needs a logical GPU). ``per_gpu=AUTO``: the
    actor sizes its slots and spares where it runs, and the pool schedules on what it reports
    (here the node is this machine, without a GPU)."""
    config = EvalConfig(device="cpu", timeout_s=TIMEOUT_S, static_checks=False)
    with pytest.raises(ValueError, match="per_gpu must be at least 1, or 0 to size it, got -1"):
        RayPool(config, workers=1, per_gpu=-1)
    with RayPool(config, workers=1, per_gpu=AUTO) as sized:
        assert sized.num_slots == size_gpu_pool(HostResources.detect()).per_gpu
        assert sized.evaluate([RELU], [variant(GOOD, "sized")])[0].status is Status.CORRECT
