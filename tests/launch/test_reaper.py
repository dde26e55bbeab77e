"""Nothing that ``kernelrl env serve`` started outlives it, even after a SIGKILL (which leaves
no chance to shut Ray down): ``kernelrl.launch.reaper`` ends the orphans. First on a plain
process tree, then on the real service with its local Ray."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernelrl.launch.reaper import descendants, stop_session

REPO = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_gone(pids: set[int], seconds: float) -> set[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    return {p for p in pids if _alive(p)}


def test_orphans_of_a_killed_process_are_ended(tmp_path: Path) -> None:
    """A parent that starts the reaper and a grandchild in a session of its own (as Ray's
    agents are), then dies by SIGKILL: the grandchild is ended within seconds."""
    pid_file = tmp_path / "grandchild.pid"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            "from kernelrl.launch.reaper import start_reaper\n"
            "start_reaper()\n"
            "p = subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
            f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
            "time.sleep(600)\n",
        ]
    )
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and parent.poll() is None
        time.sleep(0.1)
    grandchild = int(pid_file.read_text())
    time.sleep(1.5)  # the reaper has listed it
    assert grandchild in {p for p, _ in descendants(parent.pid)}
    parent.kill()
    parent.wait()
    assert not _wait_gone({grandchild}, 20), "the orphan outlived its killed parent"


#: A child that takes a while to clean up after SIGTERM, and one that ignores SIGTERM in a
#: session of its own; each says when its handler is in place.
CHILD = """
import signal, sys, time
from pathlib import Path
folder, how = Path(sys.argv[1]), sys.argv[2]
def clean_up(*_):
    time.sleep(1.5)  # as vLLM's engine unlinking its shared memory on a busy machine
    (folder / "cleaned").write_text("yes")
    sys.exit(0)
signal.signal(signal.SIGTERM, clean_up if how == "slow" else signal.SIG_IGN)
(folder / how).write_text("ready")
time.sleep(600)
"""
#: Starts both children, then exits at once on SIGTERM, as vLLM's server does.
PARENT = f"""
import signal, subprocess, sys, time
child = {CHILD!r}
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
slow = subprocess.Popen([sys.executable, "-c", child, sys.argv[1], "slow"])
deaf = subprocess.Popen([sys.executable, "-c", child, sys.argv[1], "deaf"], start_new_session=True)
time.sleep(600)
"""


def test_a_stopped_session_gives_every_process_its_grace(tmp_path: Path) -> None:
    """``stop_session`` waits for the whole family, not for its leader alone: the child still
    cleaning up when its parent has exited finishes, and the one that ignores SIGTERM from a
    session of its own is killed once the grace is over."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path)], start_new_session=True)
    deadline = time.monotonic() + 60
    while not ((tmp_path / "slow").exists() and (tmp_path / "deaf").exists()):
        assert time.monotonic() < deadline and parent.poll() is None
        time.sleep(0.1)
    family = {p for p, _ in descendants(parent.pid)}
    started = time.monotonic()
    stop_session(parent, grace_s=5)
    assert (tmp_path / "cleaned").read_text() == "yes", "a child was killed while cleaning up"
    assert not _wait_gone(family | {parent.pid}, 5), "a process outlived its grace"
    assert time.monotonic() - started < 15


@pytest.mark.slow
def test_env_serve_killed_leaves_no_ray_process(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    serve = subprocess.Popen(
        [sys.executable, "-m", "kernelrl.launch.cli", "env", "serve"]
        + ["--config", str(REPO / "recipes" / "env" / "local_cpu.yaml")]
        + ["--name", "reaper-test", "--workers", "1", "--logical_gpus", "1"]
        + ["--precheck_workers", "0", "--http", "false", "--store_path", "none"],
        cwd=tmp_path,
        env={**env, "HF_HUB_OFFLINE": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        line = serve.stdout.readline()  # the banner's first line, once the workers are ready
        assert "ready" in line, line
        ray_processes = {p for p, _ in descendants(serve.pid)}
        names = {Path(f"/proc/{p}/cmdline").read_text() for p in ray_processes if _alive(p)}
        assert any("raylet" in n for n in names) and any("DashboardAgent" in n for n in names)
        os.kill(serve.pid, signal.SIGKILL)
        serve.wait()
        left = _wait_gone(ray_processes, 60)
        assert not left, [Path(f"/proc/{p}/cmdline").read_text()[:80] for p in left]
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGKILL)
