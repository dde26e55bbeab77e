"""``kernelrl env serve`` ends with status 0 when ``kernelrl env stop`` stops its service (it
used to report the stopped actor as "gone" and exit 1, as if the service had crashed)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernelrl.env.pools.service import token_variable

pytest.importorskip("ray")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "kernelrl.launch.cli"]
NAME = "kernelrl-env-stop-test"


def test_serve_exits_0_after_env_stop(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != token_variable(NAME)}
    env.update({"RAY_AUTH_MODE": "token", "KERNELRL_HOME": str(tmp_path / "home")})
    serve = subprocess.Popen(
        CLI
        + ["env", "serve", "--config", str(ROOT / "recipes" / "env" / "local_cpu.yaml")]
        + ["--name", NAME, "--workers", "1", "--logical_gpus", "1", "--precheck_workers", "0"]
        + ["--http", "false", "--store_path", "none", "--tasks", "data/tasks"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        lines: list[str] = []
        deadline = time.monotonic() + 300
        while not any("status:" in line for line in lines):
            line = serve.stdout.readline()
            assert line, "serve exited before it was ready:\n" + "".join(lines[-40:])
            lines.append(line)
            assert time.monotonic() < deadline, "serve did not come up in time"
        address = next(x for x in lines if "--address" in x).split("--address")[1].split()[0]
        stop = subprocess.run(
            CLI + ["env", "stop", "--address", address, "--name", NAME],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        assert stop.returncode == 0, stop.stderr[-2000:]
        assert serve.wait(120) == 0
        rest = serve.stdout.read()
        assert f"environment service '{NAME}' stopped by `kernelrl env stop`" in rest
        assert "is gone" not in rest
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait(30)
