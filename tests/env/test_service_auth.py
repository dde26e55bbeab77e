"""The environment service as a shared cluster meets it: attacked from loopback, as a client
that has no token, sends code the service does not hold, or queues thousands of items and goes.

One real `kernelrl env serve` (its own local Ray, one logical GPU, CPU workers) for the module,
with the default task policy (inline tasks refused), items per request raised so that one client
can queue 3,000, and a short client lease. Tests run in file order; the last one stops it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from kernelrl.env.pools.service import (
    ServiceClient,
    read_token,
    token_path,
    token_variable,
    write_token,
)
from kernelrl.env.result import Status
from kernelrl.env.task import TaskError, load_task, task_from_source

pytest.importorskip("ray.serve")

ROOT = Path(__file__).resolve().parents[2]
RELU = load_task(ROOT / "data" / "tasks" / "01_relu.py")
GOOD = (ROOT / "data" / "solutions" / "triton" / "01_relu.py").read_text()
CLI = [sys.executable, "-m", "kernelrl.launch.cli"]
NAME = "kernelrl-env-auth-test"
LEASE_S = 4.0
# Not the bundled 01_relu: a task only a client has.
CLIENT_SOURCE = RELU.source.replace("return torch.relu(x)", "return torch.relu(x)  # mine")
# A Ray client that queues N items, says so, and waits to be killed.
RAY_CLIENT = """
import sys, time
from pathlib import Path
from kernelrl.env.pools.service import ServiceClient
from kernelrl.env.task import load_task
root, name, address, n = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
task = load_task(root / "data" / "tasks" / "01_relu.py")
good = (root / "data" / "solutions" / "triton" / "01_relu.py").read_text()
client = ServiceClient(name=name, address=address)
futures = client.submit([task] * n, [good + f"\\n# ray client {i}\\n" for i in range(n)])
print("queued", len(futures), flush=True)
time.sleep(3600)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("home")
    values = {k: v for k, v in os.environ.items() if k != token_variable(NAME)}
    values.update({"RAY_AUTH_MODE": "token", "HF_HUB_OFFLINE": "1", "KERNELRL_HOME": str(home)})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_AUTH_MODE", "token")
        patch.setenv("KERNELRL_HOME", str(home))
        patch.delenv(token_variable(NAME), raising=False)
        yield values


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, env: dict[str, str]) -> dict:
    folder = tmp_path_factory.mktemp("service_auth")
    port = free_port()
    command = CLI + [
        "env", "serve", "--config", str(ROOT / "recipes" / "env" / "local_cpu.yaml"),
        "--name", NAME, "--workers", "1", "--logical_gpus", "1", "--timeout_s", "60",
        "--store_path", str(folder / "results.db"), "--http_port", str(port),
        "--max_items_per_request", "4000", "--max_client_pending", "4000",
        "--client_pool_share", "32", "--client_lease_s", str(LEASE_S),
    ]  # fmt: skip
    log = open(folder / "serve.log", "w+")  # noqa: SIM115 - read back below
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    lines: list[str] = []
    deadline = time.monotonic() + 240
    while not any("HTTP:" in line for line in lines):
        line = process.stdout.readline()
        if not line:
            log.seek(0)
            pytest.fail(f"serve exited ({process.wait()}):\n{log.read()[-3000:]}")
        lines.append(line)
        assert time.monotonic() < deadline, "serve did not come up in time"
    banner = "".join(lines)
    address = banner.split("address='", 1)[1].split("'", 1)[0]
    yield {"process": process, "url": f"http://127.0.0.1:{port}", "port": port,
           "address": address, "banner": banner, "token": read_token(NAME)}  # fmt: skip
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(90)
        except subprocess.TimeoutExpired:
            process.kill()
    log.close()


def call(url: str, token: str | None, body: object = None, timeout: float = 300) -> tuple:
    """(HTTP status, JSON payload) of one request: GET without a body, POST with one."""
    headers = {"content-type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def wait_for(condition, service: dict, timeout_s: float) -> dict:  # noqa: ANN001
    """The service's status once ``condition(status)`` holds; fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        _, status = call(f"{service['url']}/status", service["token"], timeout=60)
        if condition(status) or time.monotonic() > deadline:
            assert condition(status), {k: v for k, v in status.items() if k != "workers"}
            return status
        time.sleep(0.5)


def test_token_files_are_private_and_refused_otherwise(
    env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KERNELRL_HOME", str(tmp_path / "state"))
    token, path = write_token("unit")
    assert path == token_path("unit") and read_token("unit") == token and len(token) >= 40
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again, _ = write_token("unit")  # a new serve of the same name: a new token, still private
    assert again != token and read_token("unit") == again
    path.chmod(0o640)  # readable by the group: neither read nor replaced
    with pytest.raises(ValueError, match="lets other users read"):
        read_token("unit")
    with pytest.raises(ValueError, match="lets other users read"):
        write_token("unit")
    path.unlink()
    (tmp_path / "elsewhere").write_text("planted\n")
    path.symlink_to(tmp_path / "elsewhere")  # a link is not followed
    with pytest.raises(ValueError, match="token file"):
        read_token("unit")
    with pytest.raises(ValueError, match="not a regular file"):
        write_token("unit")
    with pytest.raises(ValueError, match="must be 1-100"):
        token_path("../escape")
    monkeypatch.setenv(token_variable("unit"), "from-the-environment")
    assert read_token("unit") == "from-the-environment"
    assert token_variable("unit") == "KERNELRL_UNIT_TOKEN"
    assert token_variable() == "KERNELRL_ENV_TOKEN"  # the default service's, as documented
    monkeypatch.setenv(token_variable("kernelrl-openenv"), "another-service's")
    assert read_token("unit") == "from-the-environment"  # one service's token is not another's


def test_every_route_needs_the_token(service: dict, env: dict[str, str]) -> None:
    url, token = service["url"], service["token"]
    assert str(token_path(NAME)) in service["banner"] and token not in service["banner"]
    assert stat.S_IMODE(token_path(NAME).stat().st_mode) == 0o600
    item = {"task_id": "01_relu", "solution": "no code at all"}
    for path, body in (("/status", None), ("/evaluate", item), ("/anything", None)):
        for presented in (None, "", "wrong-token", token + "x"):
            code, payload = call(url + path, presented, body)
            assert code == 401 and "bearer token" in payload["error"], (path, presented)
            assert "\n" not in payload["error"]
    assert call(f"{url}/status", token)[0] == 200
    assert call(f"{url}/evaluate", token, item)[0] == 200
    with pytest.raises(ValueError, match="refused the token"):
        ServiceClient(name=NAME, address=service["address"], token="wrong-token")
    wrong = {**env, token_variable(NAME): "wrong-token"}
    for command in ("status", "stop"):
        done = subprocess.run(
            CLI + ["env", command, "--address", service["address"], "--name", NAME],
            capture_output=True, text=True, env=wrong, timeout=300,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr[-2000:]
        assert "refused the token" in done.stderr.strip().splitlines()[-1]  # one line, last
    assert call(f"{url}/status", token)[0] == 200  # the refused stop stopped nothing


def test_tasks_the_service_does_not_hold_are_refused(service: dict) -> None:
    url, token = service["url"], service["token"]
    inline = {"task": {"source": CLIENT_SOURCE, "id": "mine"}, "solution": GOOD}
    code, payload = call(f"{url}/evaluate", token, inline)
    assert code == 403 and "allow_inline_tasks" in payload["error"], payload
    assert "\n" not in payload["error"]
    code, payload = call(f"{url}/evaluate", token, {"items": [inline, inline]})
    assert code == 403
    # its own task, sent by source, is its own (not a client's)
    held = {"task": {"source": RELU.source, "id": "by_source"}, "solution": "no code at all"}
    code, result = call(f"{url}/evaluate", token, held)
    assert code == 200 and result["status"] == "format_error" and result["task_hash"] == RELU.hash
    loose = dataclasses.replace(RELU, atol=1e9)  # its source, other tolerances: not its task
    with ServiceClient(name=NAME, address=service["address"]) as client:
        futures = client.submit(
            [task_from_source(CLIENT_SOURCE, "mine"), loose, RELU],
            ["no code at all", "no code at all", "no code, again"],
        )
        for future in futures[:2]:
            with pytest.raises(TaskError, match="allow_inline_tasks"):
                future.result(timeout=300)
        assert futures[2].result(timeout=300).status == Status.FORMAT_ERROR


def test_a_client_that_disconnects_leaves_nothing_queued(service: dict) -> None:
    """3,000 items over HTTP, then the client hangs up: its items leave the service's queue
    and the pool's, and the next client's single request is answered as if they never were."""
    url, token, port = service["url"], service["token"], service["port"]
    items = [{"task_id": "01_relu", "solution": GOOD + f"\n# gone {i}\n"} for i in range(3000)]
    body = json.dumps({"items": items}).encode()
    head = (
        f"POST /evaluate HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    gone = socket.create_connection(("127.0.0.1", port))
    gone.sendall(head.encode() + body)
    queued = wait_for(lambda s: s["service_unresolved"] >= 2900, service, 120)
    assert queued["queued"] + queued["in_flight"] <= 32  # the client's share of the pool
    gone.close()
    started = time.monotonic()
    item = {"task_id": "01_relu", "solution": GOOD + "\n# the next client\n"}
    code, result = call(f"{url}/evaluate", token, item, timeout=120)
    assert code == 200 and result["task_id"] == "01_relu", result
    assert time.monotonic() - started < 60
    status = wait_for(lambda s: s["service_unresolved"] == 0 and s["queued"] == 0, service, 30)
    assert status["service_queued"] == 0 and status["http_in_flight"] == 0
    assert status["client_items_dropped"] >= 2900 and status["cancelled"] >= 1


def test_a_ray_client_that_dies_leaves_nothing_queued(service: dict, env: dict[str, str]) -> None:
    """The same for a Ray client whose process is killed: while it lives (longer than its lease)
    its items stay; once its lease lapses they are cancelled."""
    command = [sys.executable, "-c", RAY_CLIENT, str(ROOT), NAME, service["address"], "3000"]
    dropped_earlier = wait_for(lambda s: True, service, 0)["client_items_dropped"]
    client = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        line = client.stdout.readline().decode()
        assert line.startswith("queued 3000"), client.stderr.read().decode()[-3000:]
        time.sleep(2.5 * LEASE_S)  # alive past its lease: renewed, so nothing was dropped
        before = wait_for(lambda s: True, service, 0)
        # What the pool evaluated meanwhile depends on the machine's speed; what was dropped not.
        assert before["client_items_dropped"] == dropped_earlier and before["clients"] >= 1
        assert before["service_unresolved"] >= 2600
    finally:
        client.kill()
        client.wait()
    status = wait_for(lambda s: s["service_unresolved"] == 0 and s["queued"] == 0, service, 60)
    # Most of the 3,000 were cancelled (a few finish between the snapshot and the kill, more on
    # a loaded box); none is left: the queues emptied above, far faster than running them.
    assert status["client_items_dropped"] - before["client_items_dropped"] >= 2500
    started = time.monotonic()
    item = {"task_id": "01_relu", "solution": GOOD + "\n# after the ray client\n"}
    code, _ = call(f"{service['url']}/evaluate", service["token"], item, timeout=120)
    assert code == 200 and time.monotonic() - started < 60


def test_items_per_request_are_limited(service: dict) -> None:
    items = [{"task_id": "01_relu", "solution": "x"}] * 4001
    code, payload = call(f"{service['url']}/evaluate", service["token"], {"items": items})
    assert code == 413 and "limit is 4000" in payload["error"]


def test_stop_with_the_token_removes_it(service: dict, env: dict[str, str]) -> None:
    done = subprocess.run(
        CLI + ["env", "stop", "--address", service["address"], "--name", NAME],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert not token_path(NAME).exists()
    assert service["process"].wait(120) in (0, 1)  # serve sees its actor gone and exits
