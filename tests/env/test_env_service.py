"""The environment service end to end: `kernelrl env serve` in a subprocess (its own local Ray
with a logical GPU, inline tasks allowed), a Ray client and an HTTP client sharing it, `kernelrl
env status`, a clean stop on SIGINT; then `kernelrl env check-suite --pool ray`. Tests run in
file order. Authentication, limits and cancellation: test_service_auth.py."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from kernelrl.env.pools.service import read_token, token_path, token_variable
from kernelrl.env.result import Status
from kernelrl.env.store import ResultsStore
from kernelrl.env.task import TaskError, load_task, task_from_source
from kernelrl.launch.cli import main as cli_main

pytest.importorskip("ray.serve")

ROOT = Path(__file__).resolve().parents[2]
RELU = load_task(ROOT / "data" / "tasks" / "01_relu.py")
GOOD = (ROOT / "data" / "solutions" / "triton" / "01_relu.py").read_text()
SEGFAULT = (
    Path(__file__).parents[1] / "solutions" / "dynamic" / "runtime_error__segfault.py"
).read_text()
CLI = [sys.executable, "-m", "kernelrl.launch.cli"]
NAME = "kernelrl-env-test"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def client_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    # Ray turns token authentication on for local clusters; a client that joins by address
    # opts in explicitly (the token itself is in ~/.ray/auth_token, as for any local cluster).
    # The service's own token goes to a private KERNELRL_HOME, where its clients read it.
    home = str(tmp_path_factory.mktemp("kernelrl_home"))
    env = {k: v for k, v in os.environ.items() if k != token_variable(NAME)}
    env.update({"RAY_AUTH_MODE": "token", "HF_HUB_OFFLINE": "1", "KERNELRL_HOME": home})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_AUTH_MODE", "token")
        patch.setenv("KERNELRL_HOME", home)
        patch.delenv(token_variable(NAME), raising=False)
        yield env


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, client_env: dict[str, str]) -> dict:
    folder = tmp_path_factory.mktemp("env_service")
    store_path = folder / "results.db"
    port = free_port()
    command = CLI + [
        "env", "serve", "--config", str(ROOT / "recipes" / "env" / "local_cpu.yaml"),
        "--name", NAME, "--workers", "1", "--logical_gpus", "1", "--timeout_s", "60",
        "--store_path", str(store_path), "--http_port", str(port), "--allow_inline_tasks", "true",
    ]  # fmt: skip
    log = open(folder / "serve.log", "w+")  # noqa: SIM115 - read back below
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=log, text=True, env=client_env
    )
    lines: list[str] = []
    deadline = time.monotonic() + 240
    while not any("HTTP:" in line for line in lines):
        line = process.stdout.readline()
        if not line:
            log.seek(0)
            pytest.fail(f"serve exited ({process.wait()}):\n{log.read()[-3000:]}")
        lines.append(line)
        assert time.monotonic() < deadline, "serve did not come up in time"
    text = "".join(lines)
    address = re.search(r"address='([^']+)'", text).group(1)
    info = {"process": process, "address": address, "url": f"http://127.0.0.1:{port}",
            "store_path": store_path, "banner": text, "log": log,
            "token": read_token(NAME)}  # fmt: skip
    yield info
    if process.poll() is None:  # a test failed before the stop test: do not leak the cluster
        process.send_signal(signal.SIGINT)
        try:
            process.wait(90)
        except subprocess.TimeoutExpired:
            process.kill()
    log.close()


def post(url: str, body: object, token: str, timeout: float = 300) -> tuple[int, object]:
    headers = {"content-type": "application/json", "Authorization": f"Bearer {token}"}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_recipe_errors_are_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("workers: [1\n")
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("wrokers: 2\n")
    for argv, message in (
        (["--config", str(tmp_path / "missing.yaml")], "does not exist"),
        (["--config", str(bad_yaml)], "malformed YAML"),
        (["--config", str(unknown)], "wrokers"),
        (["--device", "tpu"], "device must be cpu, cuda or auto"),
        (["--detach", "true"], "detach needs an address"),
        (["--per_gpu", "-1"], "per_gpu must be at least 1, or 0 to size it, got -1"),
    ):
        assert cli_main(["env", "serve", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


def test_ray_client_uses_the_named_service(service: dict) -> None:
    import ray

    from kernelrl.env.pools import Pool
    from kernelrl.env.pools.service import ServiceClient

    assert f"name={NAME!r}" in service["banner"] and "RAY_AUTH_MODE=token" in service["banner"]
    assert "ServiceClient(" in service["banner"]
    with ServiceClient(name=NAME, address=service["address"]) as client:
        assert isinstance(client, Pool) and client.num_slots == 2 and client.device == "cpu"
        solutions = [GOOD + "\n# ray client\n", SEGFAULT]
        results = client.evaluate([RELU, RELU], solutions)
        assert [r.status for r in results] == [Status.CORRECT, Status.RUNTIME_ERROR]
        broken = task_from_source(RELU.source.replace("torch.relu(x)", "torch.relu(y)"), "broken")
        futures = client.submit([broken, RELU], [GOOD, GOOD + "\n# beside broken\n"])
        with pytest.raises(TaskError, match=r"broken: .*reference"):  # the task's failure
            futures[0].result(timeout=300)
        assert futures[1].result(timeout=300).correct
        stats = client.stats()
        assert stats["completed"] == 4 and stats["store_results"] == 3  # no verdict for broken
    assert not ray.is_initialized()  # the client disconnected; the service runs on


def test_http_endpoint_shares_pool_and_cache(service: dict) -> None:
    url, token = service["url"], service["token"]
    code, result = post(f"{url}/evaluate", {"task_id": "01_relu", "solution": GOOD}, token)
    assert code == 200 and result["status"] == "correct" and result["task_id"] == "01_relu"
    # Evaluated once by the Ray client above? No: its texts differed. Now repeat this one.
    started = time.monotonic()
    code, again = post(f"{url}/evaluate", {"task_id": "01_relu", "solution": GOOD}, token)
    assert code == 200 and again == result and time.monotonic() - started < 5  # cache hit
    body = {
        "items": [
            {"task": {"source": RELU.source, "id": "my_relu"}, "solution": "no code at all"},
            {"task_id": "01_relu", "solution": GOOD + "\n# http batch\n"},
        ]
    }
    code, batch = post(f"{url}/evaluate", body, token)
    assert code == 200 and [r["status"] for r in batch] == ["format_error", "correct"]
    assert batch[0]["task_id"] == "my_relu" and batch[0]["feedback"]
    for bad, expected, message in (
        ({"task_id": "nope", "solution": GOOD}, 400, "unknown task_id"),
        ({"task_id": "01_relu"}, 400, "'solution'"),
        ({"solution": GOOD}, 400, "task_id"),
        # a well-formed request whose inline task does not load: 422, as docs/guide/service.md says
        ({"task": {"source": "x = 1", "id": "t"}, "solution": GOOD}, 422, "not a KernelBench task"),
    ):
        code, payload = post(f"{url}/evaluate", bad, token)
        assert code == expected and message in payload["error"], payload
    request = urllib.request.Request(f"{url}/status", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=60) as response:
        status = json.load(response)
    assert status["cache_hits"] >= 1 and status["workers"][0]["state"] == "ok"


def test_client_tasks_are_untrusted(service: dict) -> None:
    """A task the service does not hold, sent inline over HTTP or as a Task by a Ray client, is
    evaluated as an untrusted task (its hash says so: an untrusted task's is salted), however
    the client marked it; one it holds (same source and metadata) stays the service's own."""
    from kernelrl.env.pools.service import ServiceClient

    source = RELU.source.replace("return torch.relu(x)", "return torch.relu(x)  # a client's")
    mine = task_from_source(source, "client_relu")
    assert mine.trusted and mine.hash != task_from_source(source, "x", trusted=False).hash
    untrusted_hash = task_from_source(source, "x", trusted=False).hash
    item = {"task": {"source": source, "id": "client_relu"}, "solution": "no code at all"}
    code, result = post(f"{service['url']}/evaluate", item, service["token"])
    assert code == 200 and result["status"] == "format_error"
    assert result["task_hash"] == untrusted_hash
    with ServiceClient(name=NAME, address=service["address"]) as client:
        held, sent = client.evaluate([RELU, mine], ["no code at all", "no code, again"])
    assert held.task_hash == RELU.hash and sent.task_hash == untrusted_hash
    assert sent.status == Status.FORMAT_ERROR


def test_status_command(service: dict, client_env: dict[str, str]) -> None:
    command = CLI + ["env", "status", "--address", service["address"], "--name", NAME]
    done = subprocess.run(command + ["--json"], capture_output=True, text=True, env=client_env)
    assert done.returncode == 0, done.stderr[-2000:]
    stats = json.loads(done.stdout)
    assert stats["address"] == service["address"] and stats["queued"] == 0
    assert [w["kind"] for w in stats["workers"]] == ["gpu", "cpu"]
    assert stats["completed"] >= 5 and stats["throughput_per_s"] > 0
    assert stats["worker_deaths"] == 0 and stats["store_results"] >= 5
    table = subprocess.run(command, capture_output=True, text=True, env=client_env)
    assert table.returncode == 0 and "queue depth 0" in table.stdout
    assert "worker deaths 0" in table.stdout and "cache hits" in table.stdout
    missing = subprocess.run(
        CLI + ["env", "status", "--address", service["address"], "--name", "nobody"],
        capture_output=True,
        text=True,
        env=client_env,
    )
    assert missing.returncode == 2
    assert "no kernelrl environment service named 'nobody'" in missing.stderr


def test_serve_stops_cleanly_and_keeps_its_results(service: dict) -> None:
    process = service["process"]
    assert token_path(NAME).is_file()
    process.send_signal(signal.SIGINT)
    assert process.wait(90) == 0
    assert "stopping environment service" in process.stdout.read()
    assert not token_path(NAME).exists()  # the token dies with the service
    with ResultsStore(service["store_path"]) as store:  # everything it evaluated is on disk
        statuses = [row["status"] for row in store.rows()]
        assert statuses.count("correct") >= 4 and "runtime_error" in statuses
        assert len(store.to_dataset()) == len(statuses)


def test_check_suite_on_the_ray_pool(client_env: dict[str, str]) -> None:
    command = CLI + [
        "env", "check-suite", "--pool", "ray", "--workers", "2", "--per-gpu", "2", "--device", "cpu",
        "--tasks", "01_relu,02_gelu", "--timeout", "120",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=client_env, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "kernelrl env check-suite" in done.stdout  # the summary table
    assert re.search(r"2 evaluations in .* on 4 slots; correct: 2", done.stdout)
