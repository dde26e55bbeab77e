"""The sandbox child's view of the host's files (env/sandbox/isolation_view.py), through the real
sandbox on CPU: a Unix socket file planted on the host (in /var/tmp, /run, a home, beside the
checkout...) cannot be connected to from inside, whatever its mode; no host path is writable
but the child's scratch directory; and a worker that is not root (the user-namespace path)
gives the same guarantees, with its own home out of the child's reach.

The probe is tests/solutions/isolation/host_view_probe.py; what it reports is checked against
what the trusted side sees itself: a planted socket's listener has no pending connection, and
no file the probe tried to write exists on the host. Static checks are off so that the sandbox
is tested on its own. Where the host refuses a namespace, the test skips saying why.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelrl.env.evaluator import EvalConfig
from kernelrl.env.pools.local import LocalPool
from kernelrl.env.result import EvalResult, Status
from kernelrl.env.task import load_task

ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).resolve().parents[1] / "solutions" / "isolation" / "host_view_probe.py"
RELU_PATH = ROOT / "data" / "tasks" / "01_relu.py"
NOBODY = 65534
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000


def require_mount_namespace() -> None:
    """Skip where this host refuses a mount namespace as the sandbox asks for it."""
    code = (
        "import ctypes, os, sys\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"if libc.unshare({CLONE_NEWNS}) == 0 or libc.unshare({CLONE_NEWNS | CLONE_NEWUSER}) == 0:\n"
        "    sys.exit(0)\n"
        "print(os.strerror(ctypes.get_errno()))\n"
        "sys.exit(1)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"this host refuses a mount namespace: unshare: {done.stdout.strip()}")


class Planted:
    """Listening Unix sockets planted at host paths (any user may connect: mode 777)."""

    def __init__(self) -> None:
        self.listeners: dict[str, socket.socket] = {}

    def plant(self, path: Path, owner: int | None = None, mode: int = 0o777) -> None:
        try:
            path.unlink(missing_ok=True)
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(str(path))
        except OSError:
            return  # not a place this host lets us use
        listener.listen(8)
        listener.setblocking(False)
        os.chmod(path, mode)
        if owner is not None:
            os.chown(path, owner, owner)
        self.listeners[str(path)] = listener

    def connected(self) -> list[str]:
        """The planted sockets someone connected to: the trusted side's own evidence."""
        reached = []
        for path, listener in self.listeners.items():
            with contextlib.suppress(BlockingIOError):
                peer, _ = listener.accept()
                peer.close()
                reached.append(path)
        return reached

    def close(self) -> None:
        for path, listener in self.listeners.items():
            listener.close()
            with contextlib.suppress(OSError):
                os.unlink(path)


def host_places() -> list[Path]:
    """Folders where a host's processes leave sockets, or that anyone may write to."""
    candidates = [Path("/var/tmp"), Path("/run"), Path.home(), ROOT.parent, ROOT, Path("/tmp")]
    candidates += [Path("/dev/shm"), Path("/run/user")]
    return [p for p in candidates if p.is_dir() and not p.is_symlink()]


def probe_source(sockets: list[str], read: list[str], write: list[str], marker: str) -> str:
    targets = {"sockets": sockets, "read": read, "write": write, "marker": marker}
    text = PROBE.read_text()
    placeholder = (
        'TARGETS = {"sockets": [], "read": [], "write": [], "marker": "kernelrl-probe-written"}'
    )
    assert placeholder in text
    return text.replace(placeholder, f"TARGETS = {targets!r}")


def report_of(result: EvalResult) -> dict:
    assert result.status is Status.RUNTIME_ERROR, (result.status, result.feedback)
    text = result.error or result.feedback
    assert "PROBE" in text, text
    return json.loads(text.split("PROBE")[-2])


def writable_host_mounts(report: dict) -> list[list]:
    """Mounts the child may write that are the host's: anything but its scratch directory,
    its private tmpfs on /tmp and /dev/shm, its own /proc, and device files."""
    found = []
    for point, root, fstype, char_device in report["mounts"]:
        if char_device or point == report["cwd"] or (point, fstype) == ("/proc", "proc"):
            continue
        if point in ("/tmp", "/dev/shm") and fstype == "tmpfs" and root == "/":
            continue  # a fresh tmpfs of its own
        found.append([point, root, fstype])
    return found


def probe_through_pool(device: str) -> dict:
    """The probe and a legitimate solution through a pool of this worker on ``device``,
    sockets planted beforehand; what the trusted side saw afterwards."""
    marker = f"kernelrl-probe-{uuid.uuid4().hex}"
    planted = Planted()
    places = host_places()
    for place in places:
        planted.plant(place / f".{marker}.sock")
    source = probe_source(list(planted.listeners), [], [str(p) for p in places], marker)
    legit = (ROOT / "data" / "solutions" / "triton" / "01_relu.py").read_text()
    config = EvalConfig(device=device, timeout_s=120, static_checks=False)
    if device == "cpu":
        config.host_memory_bytes = 2 * 2**30
    try:
        with LocalPool(config, workers=1) as pool:
            result, legit_result = pool.evaluate([load_task(RELU_PATH)] * 2, [source, legit])
        return {
            "result": result,
            "legit": legit_result,
            "sockets": list(planted.listeners),
            "connected": planted.connected(),
            "written": [str(p) for p in places if (p / marker).exists()],
        }
    finally:
        planted.close()
        for place in places:
            with contextlib.suppress(OSError):
                (place / marker).unlink()


@pytest.fixture(scope="module")
def root_worker() -> dict:
    require_mount_namespace()
    return probe_through_pool("cpu")


def private(path: str) -> bool:
    """Inside the child's own tmpfs on /tmp or /dev/shm (what it writes there is its own)."""
    return any(path == top or path.startswith(top + "/") for top in ("/tmp", "/dev/shm"))


def test_no_socket_planted_on_the_host_can_be_connected_to(root_worker: dict) -> None:
    report, planted = report_of(root_worker["result"]), root_worker["sockets"]
    assert planted, "no socket could be planted on this host"
    reached = [
        p for p, outcome in zip(planted, report["sockets"], strict=True) if outcome == "connected"
    ]
    assert reached == [] and root_worker["connected"] == [], (reached, root_worker["connected"])
    assert "own root" in root_worker["result"].sandbox["isolation"]


def test_a_legitimate_solution_is_correct_in_the_view(root_worker: dict) -> None:
    legit = root_worker["legit"]
    assert legit.status is Status.CORRECT, legit.feedback
    assert "own root" in legit.sandbox["isolation"]


def test_no_host_path_is_writable_but_the_scratch_dir(root_worker: dict) -> None:
    report = report_of(root_worker["result"])
    assert root_worker["written"] == [], "the child wrote into host folders"
    assert writable_host_mounts(report) == []
    assert all(private(path) for path in report["wrote"]), report["wrote"]
    assert not {"var", "run", "home"} & set(report["top"]), report["top"]


# ---------------------------------------------------------------------- a worker that is not root

LAUNCHER = textwrap.dedent(
    """
    import ctypes, os, sys
    from kernelrl.env.sandbox import isolation_mounts
    from kernelrl.env.sandbox.linux import MS_PRIVATE, MS_REC, mount
    libc = ctypes.CDLL(None, use_errno=True)
    # As on a host where the interpreter is installed for everyone: in a mount namespace of
    # this launcher only, a root-only folder above it (a pyenv under /root) becomes passable.
    if libc.unshare(0x00020000) != 0:
        sys.exit("unshare: " + os.strerror(ctypes.get_errno()))
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    isolation_mounts._expose_needed(
        [os.path.realpath(sys.executable), sys.base_prefix, *filter(None, sys.path)]
    )
    uid = int(sys.argv[1])
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    os.execve(sys.executable, [sys.executable, "-c", *sys.argv[2:]], dict(os.environ))
    """
)

WORKER = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    from kernelrl.env.evaluator import EvalConfig
    from kernelrl.env.pools.local import LocalPool
    from kernelrl.env.task import load_task
    config = EvalConfig(
        device="cpu", timeout_s=60, host_memory_bytes=2 * 2**30, static_checks=False
    )
    with LocalPool(config, workers=1) as pool:
        (result,) = pool.evaluate([load_task(sys.argv[1])], [Path(sys.argv[2]).read_text()])
    print(json.dumps({"uid": os.geteuid(), "result": result.to_dict()}))
    """
)


@pytest.fixture(scope="module")
def user_worker() -> Iterator[dict]:
    """The same probe through a pool whose worker runs as another user (uid 65534), started
    by a launcher that drops root: its children isolate themselves in a user namespace."""
    if os.geteuid() != 0:
        pytest.skip("becoming a worker of another user needs root here (setuid)")
    require_mount_namespace()
    marker = f"kernelrl-probe-{uuid.uuid4().hex}"
    parent = Path("/home") if Path("/home").is_dir() else Path(tempfile.gettempdir())
    home = parent / f"kernelrl-test-home-{uuid.uuid4().hex[:12]}"
    home.mkdir(mode=0o700)
    secret = home / "secret.txt"
    secret.write_text("the worker user's secret")
    secret.chmod(0o600)
    shared = Path(tempfile.mkdtemp(prefix="kernelrl-probe-"))
    shared.chmod(0o755)
    planted = Planted()
    planted.plant(home / "agent.sock", owner=NOBODY, mode=0o600)  # the user's own socket
    for place in host_places():
        planted.plant(place / f".{marker}.sock")
    for path in (home, secret, *home.iterdir()):
        os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    places = [home, *host_places()]
    source = probe_source(list(planted.listeners), [str(secret)], [str(p) for p in places], marker)
    (shared / "probe.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH", "LANG")}
    env["HOME"] = str(home)
    try:
        done = subprocess.run(
            [sys.executable, "-c", LAUNCHER, str(NOBODY), WORKER]
            + [str(RELU_PATH), str(shared / "probe.py")],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            cwd=str(shared),
        )
        assert done.returncode == 0, done.stderr[-3000:]
        answer = json.loads(done.stdout.strip().splitlines()[-1])
        written = [str(p) for p in places if (p / marker).exists()]
        yield {
            "uid": answer["uid"],
            "result": EvalResult.from_dict(answer["result"]),
            "sockets": list(planted.listeners),
            "connected": planted.connected(),
            "written": written,
        }
    finally:
        planted.close()
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(shared, ignore_errors=True)
        for place in host_places():
            with contextlib.suppress(OSError):
                (place / marker).unlink()


def test_a_worker_that_is_not_root_gives_the_same_guarantees(user_worker: dict) -> None:
    assert user_worker["uid"] == NOBODY
    isolation = str(user_worker["result"].sandbox.get("isolation"))
    if "namespaces: user+" not in isolation:
        pytest.skip(f"this host refuses an unprivileged user namespace: {isolation!r}")
    report, planted = report_of(user_worker["result"]), user_worker["sockets"]
    reached = [
        p for p, outcome in zip(planted, report["sockets"], strict=True) if outcome == "connected"
    ]
    assert reached == [] and user_worker["connected"] == [], (reached, user_worker["connected"])
    # The child runs as the worker's own uid there: only the view keeps its home out of reach.
    assert report["read"] == [os.strerror(2)], report["read"]  # no such file: not in view
    assert user_worker["written"] == [] and writable_host_mounts(report) == []
    assert all(private(path) for path in report["wrote"]), report["wrote"]
    assert "own root" in isolation, isolation


@pytest.mark.gpu
def test_on_a_gpu_the_view_holds_what_a_child_needs_and_no_host_socket() -> None:
    """The GPU's device files, the driver's libraries and what Triton compiles its launcher
    with are inside the view: a legitimate solution is correct there, timed; the probe still
    reaches no planted socket and writes nowhere on the host."""
    require_mount_namespace()
    seen = probe_through_pool("cuda")
    legit = seen["legit"]
    assert legit.status is Status.CORRECT and legit.timing_meaningful, legit.feedback
    assert "own root" in legit.sandbox["isolation"], legit.sandbox["isolation"]
    report = report_of(seen["result"])
    reached = [
        p
        for p, outcome in zip(seen["sockets"], report["sockets"], strict=True)
        if outcome == "connected"
    ]
    assert reached == [] and seen["connected"] == [] and seen["written"] == []
    assert writable_host_mounts(report) == []
