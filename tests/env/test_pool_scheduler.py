"""The Ray pool's scheduler, driven directly (no Ray): longest-first placement and blame
isolation, the two decisions that are kernelrl's own, and the cost model both pools order a
batch by."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from kernelrl.env.pools.scheduler import (
    DEFAULT_SECONDS_PER_CHAR,
    CostModel,
    Job,
    Scheduler,
    blame,
)

_keys = itertools.count()


def job(cost: float, batch: int = 0, name: str = "") -> Job:
    return Job(next(_keys), batch, cost, payload=name or f"cost {cost}")


def names(placed: list[tuple[Job, object]]) -> list[tuple[str, object]]:
    return [(j.payload, w) for j, w in placed]


def test_longest_first_within_a_batch_on_the_least_loaded_worker() -> None:
    scheduler = Scheduler()
    scheduler.add_worker("a", 2)
    scheduler.add_worker("b", 2)
    for cost in (1.0, 8.0, 3.0, 5.0, 2.0):
        scheduler.push(job(cost))
    placed = scheduler.assign()
    # The most expensive first; each on the worker with the least expected work so far.
    assert names(placed) == [
        ("cost 8.0", "a"),
        ("cost 5.0", "b"),
        ("cost 3.0", "b"),
        ("cost 2.0", "a"),
    ]
    assert scheduler.queued == 1 and scheduler.running == 4
    assert scheduler.assign() == []  # every slot is taken
    scheduler.release(placed[1][0])  # b's 5 s job is done
    assert names(scheduler.assign()) == [("cost 1.0", "b")]


def test_batches_are_served_in_submission_order() -> None:
    scheduler = Scheduler()
    scheduler.add_worker(0, 1)
    scheduler.push(job(1.0, batch=0, name="first batch, cheap"))
    scheduler.push(job(100.0, batch=1, name="second batch, expensive"))
    order = []
    while placed := scheduler.assign():
        (done, _), *_ = placed
        order.append(done.payload)
        scheduler.release(done)
    assert order == ["first batch, cheap", "second batch, expensive"]


def test_a_worker_that_is_down_gets_nothing() -> None:
    scheduler = Scheduler()
    scheduler.add_worker(0, 4)
    scheduler.add_worker(1, 4)
    scheduler.set_up(0, False)
    for _ in range(3):
        scheduler.push(job(1.0))
    assert {w for _, w in scheduler.assign()} == {1}
    scheduler.set_up(0, True)
    scheduler.push(job(1.0))
    assert [w for _, w in scheduler.assign()] == [0]


def test_jobs_in_flight_on_a_dead_worker_rerun_alone() -> None:
    scheduler = Scheduler(max_retries=1)
    scheduler.add_worker(0, 2)
    scheduler.add_worker(1, 2)
    killer, innocent, other_a, other_b = (
        job(4.0, name="killer"),
        job(3.0, name="innocent"),
        job(2.0, name="a"),
        job(1.0, name="b"),
    )
    for j in (killer, innocent, other_a, other_b):
        scheduler.push(j)
    placed = dict(names(scheduler.assign()))
    assert placed == {"killer": 0, "innocent": 1, "a": 1, "b": 0}

    # Worker 0 dies with the killer and b on it: either may have done it, both are blamed once
    # and rerun alone; the worker is down until it is back.
    scheduler.set_up(0, False)
    assert scheduler.lost(killer, "worker 0 died") and scheduler.lost(other_b, "worker 0 died")
    assert killer.alone and other_b.alone and killer.attempts == 1
    # Nothing is idle (worker 1 still runs two): the alone jobs wait, and nothing is placed
    # beside worker 1's jobs meanwhile either.
    assert scheduler.assign() == []
    scheduler.set_up(0, True)
    assert names(scheduler.assign()) == [("killer", 0)]  # the longest, alone on the idle one
    assert scheduler.assign() == []  # b waits for an idle worker: 0 is not, 1 is busy
    scheduler.release(innocent)
    scheduler.release(other_a)
    assert names(scheduler.assign()) == [("b", 1)]
    scheduler.push(job(0.5, name="late"))
    assert scheduler.assign() == []  # both workers run a job alone: nothing goes beside

    # It kills its worker again, alone this time: given up, blamed. b, also alone, finishes.
    assert not scheduler.lost(killer, "worker 0 died again")
    assert killer.attempts == 2 and killer.worker is None and not killer.queued
    message = blame(killer)
    assert "lost 2 times" in message and "1 of them with nothing else running" in message
    assert "- worker 0 died\n- worker 0 died again" in message
    scheduler.release(other_b)
    assert names(scheduler.assign()) == [("late", 0)]
    assert other_b.attempts == 1  # its one loss was not its doing; it was answered normally


def test_a_job_that_lost_its_worker_through_no_fault_of_its_own_is_not_blamed() -> None:
    scheduler = Scheduler(max_retries=0)
    scheduler.add_worker(0, 2)
    stuck, neighbour = job(2.0, name="stuck"), job(1.0, name="neighbour")
    scheduler.push(stuck)
    scheduler.push(neighbour)
    scheduler.assign()
    # The pool restarts the worker because `stuck` hangs: `neighbour` is collateral.
    assert not scheduler.lost(stuck, "did not answer")  # max_retries=0: given up at once
    assert scheduler.lost(neighbour, None)
    assert neighbour.attempts == 0 and not neighbour.alone and neighbour.queued
    assert names(scheduler.assign()) == [("neighbour", 0)]


def test_withdrawn_jobs_are_never_placed_and_a_requeue_places_once() -> None:
    scheduler = Scheduler()
    scheduler.add_worker(0, 4)
    expired, kept = job(5.0, name="expired"), job(1.0, name="kept")
    scheduler.push(expired)
    scheduler.push(kept)
    assert scheduler.withdraw(expired) and not scheduler.withdraw(expired)
    assert scheduler.queued == 1
    assert names(scheduler.assign()) == [("kept", 0)]
    # Withdrawn, then queued again (as a harness_error rerun is): one placement, not two.
    again = job(2.0, name="again")
    scheduler.push(again)
    scheduler.withdraw(again)
    scheduler.push(again)
    scheduler.push(again)  # already queued: no second entry
    assert names(scheduler.assign()) == [("again", 0)]
    assert scheduler.assign() == [] and scheduler.queued == 0
    scheduler.push(job(1.0, name="left"))
    assert [j.payload for j in scheduler.clear()] == ["left"] and scheduler.queued == 0


def test_a_simulated_batch_blames_only_the_worker_killer() -> None:
    """A whole batch through the scheduler with a toy cluster: 3 workers x 2 slots, one
    solution that kills whichever worker runs it. Every innocent job completes; only the
    killer is given up, after max_retries + 1 deaths."""
    scheduler = Scheduler(max_retries=2)
    for worker in range(3):
        scheduler.add_worker(worker, 2)
    jobs = [job(float(10 - i), name=f"job {i}") for i in range(9)]
    jobs[4].payload = "killer"
    for j in jobs:
        scheduler.push(j)
    completed, given_up, deaths = [], [], 0
    while scheduler.queued or scheduler.running:
        placed = scheduler.assign()
        assert placed or scheduler.running, "stalled with work queued"
        running = [j for j in jobs if j.worker is not None]
        on_killer = {j.worker for j in running if j.payload == "killer"}
        if on_killer:  # the killer's worker dies, taking everything on it
            (dead,) = on_killer
            deaths += 1
            for victim in [j for j in running if j.worker == dead]:
                if not scheduler.lost(victim, f"worker {dead} died"):
                    given_up.append(victim.payload)
            continue
        for j in running:  # everything else finishes
            scheduler.release(j)
            completed.append(j.payload)
    assert given_up == ["killer"] and deaths == 3
    assert sorted(completed) == sorted(j.payload for j in jobs if j.payload != "killer")
    innocent_losses = [j.attempts for j in jobs if j.payload != "killer" and j.attempts]
    assert all(n == 1 for n in innocent_losses)  # lost once beside it, then fine alone


def test_cost_model_uses_measurements_then_source_size() -> None:
    costs = CostModel()
    assert costs.estimate([("t1", 1000)]) == [pytest.approx(1000 * DEFAULT_SECONDS_PER_CHAR)]
    costs.observe("t1", 4.0)
    # The measured task costs what it took; an unknown one is scaled by the measured rate.
    assert costs.estimate([("t1", 1000), ("t2", 500)]) == [4.0, pytest.approx(2.0)]
    costs.observe("t1", 2.0)
    assert costs.seconds["t1"] == pytest.approx(3.0)  # an average of its evaluations


def test_a_batch_is_ordered_longest_first_by_measured_seconds_then_by_size() -> None:
    costs = CostModel()
    small, large = (SimpleNamespace(hash=h, source="x" * 100) for h in ("small", "large"))
    # Nothing measured: the larger source first, equal ones in submission order.
    order = costs.longest_first([small, large, small], ["y" * 10, "y" * 900, "y" * 10])
    assert [index for index, _ in order] == [1, 0, 2]
    # Measured: what a task took outranks its size.
    costs.observe("small", 30.0)
    costs.observe("large", 3.0)
    order = costs.longest_first([large, small], ["y" * 900, "y" * 10])
    assert order == [(1, 30.0), (0, 3.0)]
