"""The GPU lock keeps trusted work out of every measurement but not out of each other's way, lets
a waiting measurement go first, and counts each thread's trusted work: how long it waited behind
a measurement, how long it held the lock, and nothing of another thread's. Real threads."""

import threading
import time

from kernelrl.env.gpu_lock import GpuLock


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


def test_trusted_steps_share_the_lock_and_a_measurement_waits_for_them_all() -> None:
    lock = GpuLock()
    inside = threading.Barrier(3, timeout=2)  # both trusted steps inside at once, or it breaks
    events: list[str] = []

    def trusted_step(name: str) -> None:
        with lock.trusted():
            inside.wait()
            time.sleep(0.2)
            events.append(f"{name} done")

    def measurement() -> None:
        inside.wait()
        with lock:
            events.append("measured")

    threads = [threading.Thread(target=trusted_step, args=(n,)) for n in ("a", "b")]
    threads.append(threading.Thread(target=measurement))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(events[:2]) == ["a done", "b done"]
    assert events[2] == "measured"


def test_a_waiting_measurement_goes_before_trusted_steps_that_ask_after_it() -> None:
    lock = GpuLock()
    events: list[str] = []
    first_in = threading.Event()
    measurement_asked = threading.Event()

    def first_trusted() -> None:
        with lock.trusted():
            first_in.set()
            measurement_asked.wait(2)
            time.sleep(0.2)  # the measurement is waiting for this step now
            events.append("first trusted done")

    def measurement() -> None:
        first_in.wait(2)
        measurement_asked.set()
        with lock:
            events.append("measured")

    def later_trusted() -> None:
        measurement_asked.wait(2)
        time.sleep(0.1)  # asks while the measurement waits
        with lock.trusted():
            events.append("later trusted")

    threads = [threading.Thread(target=f) for f in (first_trusted, measurement, later_trusted)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert events == ["first trusted done", "measured", "later trusted"]


def test_measurements_exclude_each_other() -> None:
    lock = GpuLock()
    inside = 0
    most = 0
    count = threading.Lock()

    def measurement() -> None:
        nonlocal inside, most
        with lock:
            with count:
                inside += 1
                most = max(most, inside)
            time.sleep(0.05)
            with count:
                inside -= 1

    threads = [threading.Thread(target=measurement) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most == 1
