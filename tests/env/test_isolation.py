"""Process isolation of the sandbox (kernelrl.env.sandbox.isolation), through the real evaluator on CPU.

Solutions here do what a generated kernel must never get away with: leave a process behind
(fork, setsid, fork again), write outside their scratch directory, look at other processes.
Static checks are off so that the sandbox is tested on its own. Where the host permits no
namespaces (an unprivileged container) the tests that need them are skipped, saying what the
child reported.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelrl.env.evaluator import EvalConfig
from kernelrl.env.pools.local import LocalPool
from kernelrl.env.result import EvalResult, Status
from kernelrl.env.task import load_task

ROOT = Path(__file__).resolve().parents[2]
RELU_TASK = load_task(ROOT / "data" / "tasks" / "01_relu.py")
MARKER = f"kernelrl-escape-{uuid.uuid4().hex}"

KERNEL = """
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


def relu(x):
    out = torch.empty_like(x)
    relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
    return out
"""

LEGIT = (
    KERNEL
    + """
class ModelNew(nn.Module):
    def forward(self, x):
        return relu(x)
"""
)

# Forks a grandchild in a session of its own, which tries to write a file outside the scratch
# directory and then lingers a minute as `python -c ... MARKER`; the evaluation itself is correct.
ESCAPE = (
    KERNEL
    + """
import os
import sys

ESCAPED = False


def escape():
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            os.setsid()
            try:
                with open({outside!r}, "w") as f:
                    f.write("escaped")
            except OSError:
                pass
            linger = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            os.execv(sys.executable, [sys.executable, "-c", linger + "time.sleep(60)", {marker!r}])
        os._exit(0)
    os.waitpid(pid, 0)


class ModelNew(nn.Module):
    def forward(self, x):
        global ESCAPED
        if not ESCAPED:
            ESCAPED = True
            escape()
        return relu(x)
"""
)

# Reports what it sees from inside through the one channel a solution has: its error message.
PROBE = (
    KERNEL
    + """
import json
import os


def try_write(path):
    try:
        with open(path, "w") as f:
            f.write("x")
        os.unlink(path)
        return "ok"
    except OSError as exc:
        return exc.strerror


class ModelNew(nn.Module):
    def forward(self, x):
        seen = {{
            "uid": os.geteuid(),
            "gid": os.getegid(),
            "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
            "outside": try_write({outside!r}),
            "root_dir": try_write("/kernelrl-probe"),
            "scratch": try_write(os.path.join(os.getcwd(), "probe")),
            "shm": sorted(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else None,
            "cwd": os.getcwd(),
        }}
        raise RuntimeError("PROBE" + json.dumps(seen) + "PROBE")
"""
)


@pytest.fixture(scope="module")
def outside_dir() -> Iterator[Path]:
    """A directory outside every scratch dir that anyone may write to: only a read-only mount
    can stop the sandbox from writing there."""
    path = Path(tempfile.mkdtemp(prefix=".isolation-probe-", dir=ROOT / "tests"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def results(outside_dir: Path) -> dict[str, EvalResult]:
    sources = {
        "legit": LEGIT,
        "escape": ESCAPE.format(outside=str(outside_dir / "escaped"), marker=MARKER),
        "probe": PROBE.format(outside=str(outside_dir / "probe")),
    }
    config = EvalConfig(
        device="cpu", timeout_s=60, host_memory_bytes=2 * 2**30, static_checks=False
    )
    with LocalPool(config, workers=2) as pool:
        evaluated = pool.evaluate([RELU_TASK] * len(sources), list(sources.values()))
    return dict(zip(sources, evaluated, strict=True))


def isolation_of(result: EvalResult) -> str:
    return str(result.sandbox.get("isolation"))


def require(result: EvalResult, *phrases: str) -> None:
    """Skip (saying what the child reported) where the host did not allow this isolation."""
    text = isolation_of(result)
    missing = [p for p in phrases if p not in text]
    if missing:
        pytest.skip(f"the host did not permit {missing}: the child reported {text!r}")


def processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                cmdline = Path(entry.path, "cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(int(entry.name))
    return found


def test_every_evaluation_reports_its_isolation(results: dict[str, EvalResult]) -> None:
    for result in results.values():
        text = isolation_of(result)
        assert text.startswith("namespaces: "), text
        assert "processes: " in text and "filesystem: " in text and "user: " in text


def test_legitimate_triton_solution_is_correct_inside(results: dict[str, EvalResult]) -> None:
    result = results["legit"]
    assert result.status is Status.CORRECT, result.feedback
    assert result.custom_kernel_launches and result.custom_kernel_launches >= 1


def test_no_process_survives_its_evaluation(
    results: dict[str, EvalResult], outside_dir: Path
) -> None:
    result = results["escape"]
    require(result, "pid", "processes: own pid namespace")
    assert result.status is Status.CORRECT, result.feedback  # the escape itself went unnoticed
    deadline = time.monotonic() + 10  # the kernel tears the namespace down as init exits
    while processes_with(MARKER) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_with(MARKER) == [], "a process of the solution outlived its evaluation"
    require(result, "filesystem: read-only")
    assert not (outside_dir / "escaped").exists(), "the solution wrote outside its scratch dir"


def test_child_is_confined(results: dict[str, EvalResult]) -> None:
    result = results["probe"]
    assert result.status is Status.RUNTIME_ERROR, result.feedback
    text = result.error or result.feedback
    assert "PROBE" in text, text
    seen = json.loads(text.split("PROBE")[-2])  # the message ends the traceback
    assert seen["scratch"] == "ok"  # its own scratch dir stays writable
    if "user: uid" in isolation_of(result):
        assert seen["uid"] != 0 and seen["gid"] != 0
    require(result, "filesystem: read-only", "own /proc", "private tmpfs on")
    # Not in its view at all (its own root), or read-only: never written, though mode 777.
    assert seen["outside"] in (os.strerror(2), os.strerror(30)), seen
    assert seen["root_dir"] in (os.strerror(30), os.strerror(13)), seen
    assert seen["pids"] and max(seen["pids"]) < 50, seen  # its own namespace's processes only
    if "/dev/shm" in isolation_of(result) and seen["cwd"].startswith("/dev/shm/"):
        assert seen["shm"] == [os.path.basename(seen["cwd"])], seen  # no other scratch dirs
    require(result, "user: uid")
    assert seen["uid"] != 0
