"""Scratch folders of workers that died (SIGKILL, OOM) are removed by the next worker, and
nothing of a live worker, of another PID namespace, of another user, or behind a link is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernelrl.env.sandbox import scratch
from kernelrl.env.sandbox.isolation_user import SANDBOX_UIDS


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_dead_workers_scratch_is_swept_and_nothing_else(tmp_path: Path) -> None:
    namespace = scratch._pid_namespace()
    dead = tmp_path / f"kernelrl-sbx-{namespace}-{_dead_pid()}-abc"
    dead_seed = tmp_path / f"kernelrl-triton-seed-{namespace}-{_dead_pid()}-def" / "triton"
    live = tmp_path / f"kernelrl-zygote-{namespace}-{scratch.os.getpid()}-ghi"
    elsewhere = tmp_path / f"kernelrl-sbx-{namespace + 1}-{_dead_pid()}-jkl"
    unrelated = tmp_path / "kernelrl-sbx-old_format"
    for folder in (dead, dead_seed, live, elsewhere, unrelated):
        folder.mkdir(parents=True)
        (folder / "child.log").write_text("x")
    removed = scratch.sweep_orphans(str(tmp_path))
    assert sorted(removed) == sorted([dead, dead_seed.parent])
    assert live.exists() and elsewhere.exists() and unrelated.exists()


def test_scratch_folders_are_named_after_their_worker() -> None:
    folder = scratch.make_scratch("sbx")
    try:
        match = scratch._NAME.match(folder.name)
        assert match is not None
        assert int(match[2]) == scratch.os.getpid()
    finally:
        folder.rmdir()


def test_only_this_users_own_folders_are_swept(tmp_path: Path) -> None:
    """The shared folder (/dev/shm) is anyone's to write: a folder under a dead worker's name
    that another user made, or a link with that name, is not ours to remove (or follow)."""
    namespace = scratch._pid_namespace()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious").write_text("keep me")
    link = tmp_path / f"kernelrl-sbx-{namespace}-{_dead_pid()}-lnk"
    link.symlink_to(elsewhere)
    removed = scratch.sweep_orphans(str(tmp_path))
    assert removed == [] and link.is_symlink() and (elsewhere / "precious").exists()
    if os.geteuid() != 0:
        return  # making a folder another user's needs root
    theirs = tmp_path / f"kernelrl-sbx-{namespace}-{_dead_pid()}-oth"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    assert scratch.sweep_orphans(str(tmp_path)) == [] and theirs.is_dir()


def test_a_dead_workers_child_home_handed_to_the_childs_uid_is_swept(tmp_path: Path) -> None:
    """As root, a child's home belongs to the child's sandbox uid by the time the worker dies;
    it is still the worker's to sweep (a uid just outside the sandbox range is not)."""
    if os.geteuid() != 0:
        pytest.skip("only root hands folders to sandbox uids")
    namespace = scratch._pid_namespace()
    homes = [tmp_path / f"kernelrl-sbx-{namespace}-{_dead_pid()}-{n}" for n in ("a", "b")]
    for home, uid in zip(homes, (SANDBOX_UIDS[-1], SANDBOX_UIDS[0] - 1), strict=True):
        home.mkdir()
        (home / "child.log").write_text("")
        os.chown(home / "child.log", uid, uid)
        os.chown(home, uid, uid)
    assert scratch.sweep_orphans(str(tmp_path)) == [homes[0]]
    assert not homes[0].exists() and homes[1].is_dir()
