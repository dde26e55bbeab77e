"""The GPU lock counts each thread's trusted work: how long it waited behind a measurement, how
long it held the lock, and nothing of another thread's."""

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
