"""``kernelrl env openenv-serve``: OpenEnv's WebSocket server over kernelrl's environment, a real
pool on CPU behind it, reached with OpenEnv's client; the bearer token, and what a client cannot
reach or bring."""

from __future__ import annotations

import json
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from websockets.sync.client import connect

from kernelrl.data.bundled import bundled_solution_path
from kernelrl.env.evaluator import EvalConfig
from kernelrl.env.pools.local import LocalPool
from kernelrl.env.pools.service import token_variable
from kernelrl.launch.openenv_env import KernelAction, KernelEnvClient, TaskList
from kernelrl.launch.openenv_serve_cli import build_app, serve_in_thread
from kernelrl.prompts import MultiTurnConfig

TOKEN = "a-test-token-of-enough-characters"
CORRECT = bundled_solution_path("01_relu").read_text()
RECIPE = Path(__file__).parents[2] / "recipes" / "env" / "openenv_cpu.yaml"


@pytest.fixture(scope="module")
def url() -> str:
    with LocalPool(EvalConfig(device="cpu", timeout_s=60), workers=1) as pool:
        tasks = TaskList.bundled("triton", ["01_relu", "02_gelu_tanh"])
        app = build_app(pool, tasks, TOKEN, turns=MultiTurnConfig(max_turns=2), max_sessions=4)
        server = serve_in_thread(app)
        yield server.url
        server.stop()


def test_an_episode_over_openenvs_client(url: str) -> None:
    with KernelEnvClient(url, token=TOKEN).sync() as env:
        first = env.reset(task_id="01_relu")
        assert first.observation.task_id == "01_relu" and not first.done
        wrong = env.step(KernelAction(completion="no code at all"))
        assert wrong.observation.status == "format_error" and not wrong.done
        assert wrong.observation.messages[-1]["role"] == "user"  # the revision message
        right = env.step(KernelAction(completion=CORRECT))
        assert right.observation.status == "correct" and right.done and right.reward > 0
        state = env.state()
        assert state.statuses == ["format_error", "correct"] and state.stop_reason == "correct"


def test_every_door_but_health_needs_the_bearer_token(url: str) -> None:
    for token in ("", "not-" + TOKEN):
        with (
            pytest.raises(ConnectionError, match="403"),
            KernelEnvClient(url, token=token).sync() as env,
        ):
            env.reset()
    assert requests.get(f"{url}/schema", timeout=10).status_code == 401
    wrong = {"Authorization": f"Bearer {TOKEN.upper()}"}
    assert requests.get(f"{url}/schema", headers=wrong, timeout=10).status_code == 401
    right = {"Authorization": f"Bearer {TOKEN}"}
    assert requests.get(f"{url}/schema", headers=right, timeout=10).status_code == 200
    assert requests.get(f"{url}/health", timeout=10).status_code == 200


def test_only_the_websocket_session_is_served(url: str) -> None:
    """OpenEnv's stateless HTTP episodes and its MCP session endpoint are not there."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    body = {"jsonrpc": "2.0", "method": "openenv/session/create", "params": {}, "id": 1}
    assert requests.post(f"{url}/mcp", json=body, headers=headers, timeout=10).status_code == 404
    assert requests.post(f"{url}/reset", json={}, headers=headers, timeout=10).status_code == 404
    step = {"action": {"completion": CORRECT}}
    assert requests.post(f"{url}/step", json=step, headers=headers, timeout=10).status_code == 404


def test_a_client_cannot_bring_a_task_over_the_wire(url: str) -> None:
    source = TaskList.bundled("triton", ["01_relu"]).get("01_relu")[0].source
    with KernelEnvClient(url, token=TOKEN).sync() as env:
        with pytest.raises(RuntimeError, match="reset takes only seed, episode_id, task_id"):
            env.reset(task={"id": "mine", "source": source})
        with pytest.raises(RuntimeError, match="unknown task_id"):
            env.reset(task_id="03_silu_fp16")
    ws_url = url.replace("http://", "ws://") + "/ws"
    with connect(ws_url, additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"task_id": "01_relu"}}))
        assert json.loads(ws.recv(timeout=30))["type"] == "observation"
        action = {"completion": CORRECT, "task": {"id": "mine", "source": source}}
        ws.send(json.dumps({"type": "step", "data": action}))
        answer = json.loads(ws.recv(timeout=30))
        assert answer["type"] == "error" and answer["data"]["code"] == "VALIDATION_ERROR"


@pytest.mark.slow
def test_the_command_serves_with_a_private_token_of_its_own(tmp_path, monkeypatch) -> None:
    """``kernelrl env openenv-serve``: a new token in a 0600 file (never printed) that a client
    on this machine reads with ``read_token``, and removed when the server stops."""
    monkeypatch.setenv("KERNELRL_HOME", str(tmp_path))
    monkeypatch.delenv(token_variable("kernelrl-openenv"), raising=False)
    monkeypatch.setenv(token_variable("kernelrl-env"), "the-env-service-token")  # not this one's
    with pytest.raises(ValueError, match="no token for environment service 'kernelrl-openenv'"):
        KernelEnvClient("http://127.0.0.1:9")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "kernelrl.launch.cli", "env", "openenv-serve"]
    command += ["--config", str(RECIPE), "--port", str(port), "--env_workers", "1"]
    command += ["--task_filter", "01_relu,06_row_sum"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        banner = server.stdout.readline()
        token_file = tmp_path / "env-kernelrl-openenv.token"
        assert "/ws: 2 tasks" in banner and str(token_file) in banner, banner
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert token_file.read_text().strip() not in banner
        with KernelEnvClient(f"http://127.0.0.1:{port}").sync() as env:
            assert env.reset(task_id="06_row_sum").observation.task_id == "06_row_sum"
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    assert not token_file.exists()
    assert "Traceback" not in server.stdout.read()  # a session whose client left is no error


def test_a_short_token_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 16"):
        build_app(None, TaskList.bundled("triton", ["01_relu"]), "short")


def test_the_kernelrl_command_imports_neither_openenv_nor_torch() -> None:
    code = "import sys, kernelrl.launch.cli; print(sorted({'openenv', 'torch'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
