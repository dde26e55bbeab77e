"""env/gpu_claim.py: an evaluator working on a GPU sees the others working there, in its own
process or another; an idle one, or a process that died holding a claim, is not counted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from kernelrl.env.gpu_claim import GpuClaim

HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from kernelrl.env.gpu_claim import GpuClaim
    with GpuClaim(sys.argv[1], Path(sys.argv[2])).held():
        print("held", flush=True)
        time.sleep(600)
    """
)


def _holder(key: str, root: Path) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, key, str(root)], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "held"
    return process


def test_two_evaluators_in_one_process_see_each_other_while_both_work(tmp_path: Path) -> None:
    first, second = GpuClaim("gpu-a", tmp_path), GpuClaim("gpu-a", tmp_path)
    with first.held():
        assert second.others() == [os.getpid()]
        with second.held():
            assert first.others() == [os.getpid()]
        assert first.others() == []  # the second is idle again
    assert second.others() == []


def test_blocks_of_several_threads_share_one_claim_until_the_last_ends(tmp_path: Path) -> None:
    mine, watcher = GpuClaim("gpu-a", tmp_path), GpuClaim("gpu-a", tmp_path)
    inside, leave = threading.Barrier(3), threading.Event()

    def work() -> None:
        with mine.held():
            inside.wait()
            leave.wait()

    threads = [threading.Thread(target=work) for _ in range(2)]
    for thread in threads:
        thread.start()
    inside.wait()
    assert watcher.others() == [os.getpid()]
    assert len(list(watcher.folder.iterdir())) == 1
    leave.set()
    for thread in threads:
        thread.join()
    assert watcher.others() == [] and list(watcher.folder.iterdir()) == []


def test_work_on_another_gpu_is_not_sharing(tmp_path: Path) -> None:
    mine, theirs = GpuClaim("gpu-a", tmp_path), GpuClaim("gpu-b", tmp_path)
    with mine.held(), theirs.held():
        assert mine.others() == [] and theirs.others() == []


def test_another_process_is_seen_while_it_works_and_its_stale_claim_is_removed(
    tmp_path: Path,
) -> None:
    mine = GpuClaim("gpu-a", tmp_path)
    holder = _holder("gpu-a", tmp_path)
    try:
        assert mine.others() == [holder.pid]
    finally:
        holder.send_signal(signal.SIGKILL)  # dies holding it: its file stays behind
        holder.wait()
    assert len(list(mine.folder.iterdir())) == 1
    assert mine.others() == []
    assert list(mine.folder.iterdir()) == []
    with mine.held():
        assert list(mine.folder.iterdir()) == [mine.path]
    mine.close()
    assert list(mine.folder.iterdir()) == []
