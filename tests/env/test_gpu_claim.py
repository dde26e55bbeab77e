"""env/gpu_claim.py: an evaluator working on a GPU sees the others working there, in its own
process or another; an idle one, or a process that died holding a claim, is not counted.

The claims are trusted only where this user alone can write: a claim planted by another user
does not make measurements untimed, a claim deleted by another user does not hide a neighbour,
a FIFO does not hang the evaluator, a symbolic link never makes us delete files elsewhere, and a
claim that cannot be made (shared memory full) is not the evaluation's failure. Attacks by
another user run in a forked process that changed its uid (root only; skipped otherwise).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kernelrl.env.gpu_claim import GpuClaim

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534
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


# ---------------------------------------------------------------------- who may write claims


@pytest.fixture
def shared_root() -> Iterator[Path]:
    """A folder every user may write, sticky, as /dev/shm is."""
    path = Path(tempfile.mkdtemp(prefix="kernelrl-claims-test-"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def folder_name_of(key: str) -> str:
    """The name this user's evaluators give the claims folder of GPU ``key``."""
    with tempfile.TemporaryDirectory() as elsewhere:
        claim = GpuClaim(key, Path(elsewhere))
        name = claim.folder.name
        claim.close()
    return name


@contextlib.contextmanager
def as_another_user(act: Callable[[], object]) -> Iterator[None]:
    """``act`` run by another user (uid and gid 65534) in a forked process that stays alive,
    keeping what it opened (a claim it holds), until the block ends; its assertions count."""
    if os.geteuid() != 0:
        pytest.skip("acting as another user needs root here (setuid in a forked child)")
    ready_r, ready_w = os.pipe()
    hold_r, hold_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the forked attacker
        code = 1
        try:
            os.close(ready_r)
            os.close(hold_w)
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            act()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os.write(ready_w, str(code).encode())
            os.read(hold_r, 1)  # until the parent closes its end
            os._exit(code)
    os.close(ready_w)
    os.close(hold_r)
    try:
        outcome = os.read(ready_r, 8)
        assert outcome == b"0", "the other user's actions failed (traceback above)"
        yield
    finally:
        os.close(hold_w)
        os.close(ready_r)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def plant_folder(root: Path, name: str) -> Callable[[], object]:
    """The other user makes the claims folder first, open to everyone, with a live claim."""
    held: list[int] = []

    def act() -> None:
        folder = root / name
        folder.mkdir()
        folder.chmod(0o777)
        fd = os.open(folder / "1-planted.claim", os.O_CREAT | os.O_WRONLY, 0o666)
        fcntl.flock(fd, fcntl.LOCK_EX)
        held.append(fd)  # kept open: the claim stays live while the process lives

    return act


def test_a_claim_planted_by_another_user_does_not_untime_measurements(shared_root: Path) -> None:
    name = folder_name_of("gpu-a")
    with as_another_user(plant_folder(shared_root, name)):
        mine, second = GpuClaim("gpu-a", shared_root), GpuClaim("gpu-a", shared_root)
        assert mine.others() == []
        sharing = mine.survey()
        assert sharing.alone, sharing  # not "unknown" either: our folder is another one
        assert mine.folder != shared_root / name
        with second.held():  # our own evaluators still see each other
            assert mine.others() == [os.getpid()]
        assert (shared_root / name / "1-planted.claim").exists()  # and we removed nothing


def test_another_user_cannot_hide_a_real_neighbour(shared_root: Path) -> None:
    name = folder_name_of("gpu-a")
    with as_another_user(plant_folder(shared_root, name)):
        neighbour, mine = GpuClaim("gpu-a", shared_root), GpuClaim("gpu-a", shared_root)
        with neighbour.held():
            ours = neighbour.folder

            def delete_every_claim() -> None:
                for folder in (shared_root / name, ours):
                    with contextlib.suppress(OSError):
                        for entry in folder.iterdir():
                            entry.unlink()  # a claim of ours here would vanish

            def write_or_move_ours() -> None:
                with pytest.raises(PermissionError):
                    (ours / "x").touch()
                with pytest.raises(PermissionError):
                    ours.rename(shared_root / "moved")  # sticky root: not theirs to move

            with as_another_user(delete_every_claim):
                assert mine.others() == [os.getpid()]
            with as_another_user(write_or_move_ours):
                assert mine.others() == [os.getpid()]


def test_a_symlinked_folder_never_makes_us_delete_elsewhere(
    shared_root: Path, tmp_path: Path
) -> None:
    victim = tmp_path / "elsewhere"
    victim.mkdir(mode=0o777)
    victim.chmod(0o777)
    precious = victim / "1-precious.claim"  # named like a dead process's claim
    precious.write_text("keep me")
    name = folder_name_of("gpu-a")

    def plant_link() -> None:
        (shared_root / name).symlink_to(victim)

    with as_another_user(plant_link):
        mine = GpuClaim("gpu-a", shared_root)
        assert mine.others() == []
        assert precious.read_text() == "keep me"
        with mine.held():
            assert not mine.folder.is_symlink() and mine.path is not None
        mine.close()
    assert precious.read_text() == "keep me"


def test_a_fifo_named_like_a_claim_never_hangs_the_evaluator(tmp_path: Path) -> None:
    mine = GpuClaim("gpu-a", tmp_path)
    fifo = mine.folder / "4242-abcdef.claim"
    os.mkfifo(fifo)
    found: list[list[int]] = []
    looker = threading.Thread(target=lambda: found.append(mine.others()), daemon=True)
    looker.start()
    looker.join(10)
    assert not looker.is_alive(), "reading the claims blocked on a FIFO"
    assert found == [[]] and stat.S_ISFIFO(fifo.lstat().st_mode)


def test_only_regular_files_with_a_claims_name_are_read_or_removed(tmp_path: Path) -> None:
    mine = GpuClaim("gpu-a", tmp_path)
    target = tmp_path / "target"
    target.write_text("keep me")
    odd = {
        "notes.claim": "file",
        "x-1.claim": "file",
        "12-abc.claim.bak": "file",
        "7-link.claim": "link",
        "8-dir.claim": "dir",
    }
    for name, kind in odd.items():
        path = mine.folder / name
        if kind == "file":
            path.write_text("x")
        elif kind == "link":
            path.symlink_to(target)
        else:
            path.mkdir()
    assert mine.others() == []
    assert sorted(p.name for p in mine.folder.iterdir()) == sorted(odd)
    assert target.read_text() == "keep me"
    assert mine.survey().alone  # nothing odd makes sharing "unknown" either


def test_the_claims_folder_is_private_and_a_loose_one_is_not_used(tmp_path: Path) -> None:
    name = folder_name_of("gpu-a")
    loose = tmp_path / name
    loose.mkdir()
    loose.chmod(0o755)  # ours, but others could have put files in it
    mine = GpuClaim("gpu-a", tmp_path)
    info = mine.folder.lstat()
    assert mine.folder != loose and stat.S_ISDIR(info.st_mode)
    assert info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) == 0o700


def test_no_folder_at_all_is_unknown_sharing_not_an_error(tmp_path: Path) -> None:
    name = folder_name_of("gpu-a")
    for candidate in [name] + [f"{name}.{i}" for i in range(1, 8)]:
        (tmp_path / candidate).write_text("not a folder")
    mine = GpuClaim("gpu-a", tmp_path)
    with mine.held():  # no claim, and no exception
        sharing = mine.survey()
    assert mine.path is None and not sharing.alone
    assert sharing.unknown and "no private GPU claims folder" in sharing.unknown


FULL_SHM = textwrap.dedent(
    """
    import ctypes, json, os, sys
    from pathlib import Path
    libc = ctypes.CDLL(None, use_errno=True)
    CLONE_NEWNS, CLONE_NEWUSER, MS_REC, MS_PRIVATE = 0x20000, 0x10000000, 0x4000, 0x40000
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(CLONE_NEWNS) != 0:
        if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
            print(json.dumps({"skip": "unshare: " + os.strerror(ctypes.get_errno())}))
            sys.exit(0)
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    full = sys.argv[1].encode()
    libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None)
    if libc.mount(b"tmpfs", full, b"tmpfs", 0, b"size=64k,nr_inodes=2") != 0:
        print(json.dumps({"skip": "mount tmpfs: " + os.strerror(ctypes.get_errno())}))
        sys.exit(0)

    from kernelrl.env.evaluator import EvalConfig, Evaluator
    from kernelrl.env.gpu_claim import GpuClaim
    from kernelrl.env.result import POOL_ERROR_KEY
    from kernelrl.env.store import is_cacheable
    from kernelrl.env.task import load_task

    claim = GpuClaim("gpu-full", Path(sys.argv[1]))  # its folder takes the last inode
    with claim.held():
        sharing = claim.survey()
    task = load_task(sys.argv[2])
    config = EvalConfig(device="cpu", timeout_s=60, host_memory_bytes=2 * 2**30)
    with Evaluator(config) as evaluator:
        evaluator.gpu_claim = claim  # as on a GPU: the claim is taken around the evaluation
        result = evaluator.evaluate(task, Path(sys.argv[3]).read_text())
    print(json.dumps({
        "unknown": sharing.unknown, "pids": list(sharing.pids), "status": str(result.status),
        "sandbox": result.sandbox, "pool_error": POOL_ERROR_KEY in result.sandbox,
        "cacheable": is_cacheable(result), "feedback": result.feedback,
    }))
    """
)


def test_a_claim_that_cannot_be_made_is_not_the_evaluations_failure(tmp_path: Path) -> None:
    """Shared memory full: the evaluation runs without a claim, is judged as ever, and says
    that whether the GPU was shared is unknown (its timing unused, never stored)."""
    full = tmp_path / "full"
    full.mkdir()
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            FULL_SHM,
            str(full),
            str(ROOT / "data" / "tasks" / "01_relu.py"),
            str(ROOT / "data" / "solutions" / "triton" / "01_relu.py"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    if "skip" in seen:
        pytest.skip(f"this host refuses a private tmpfs to fill: {seen['skip']}")
    assert seen["pids"] == [] and "No space left on device" in seen["unknown"], seen
    assert seen["status"] == "correct" and not seen["pool_error"], seen
    assert "No space left on device" in seen["sandbox"]["gpu_sharing_unknown"], seen
    assert not seen["cacheable"], seen
    assert "unknown" in seen["feedback"], seen["feedback"]
