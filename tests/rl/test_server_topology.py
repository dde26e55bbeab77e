"""Server mode on CPU, real processes: a vLLM server (``kernelrl serve``: TRL's server command,
vLLM's server module, the gloo weight-transfer backend), the environment service on a Ray head,
and ``accelerate launch --num_processes 2`` trainers (DDP on gloo), all started by
``kernelrl topology``.

The first two tests share one server and run in CI: the server samples from the weights the
trainer pushed after a step (as the colocated test does), and one server-mode step with two
ranks through the whole topology. The others (3 steps, checkpoint and resume of the whole
topology, the three faults) start a full topology each and run with
``KERNELRL_TOPOLOGY_TESTS=1`` (docs/decisions.md, "The CI budget").
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")
pytest.importorskip("ray")
from rl_support import VerdictPool, smollm2_folder, task_rows  # noqa: E402

from kernelrl.env.result import Status  # noqa: E402
from kernelrl.launch.reaper import stop_session  # noqa: E402

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "smoke" / "server_cpu.yaml"
TOLERANCE = 0.02
LONG = pytest.mark.skipif(
    not os.environ.get("KERNELRL_TOPOLOGY_TESTS"),
    reason="the long topology tests (~15 min) run with KERNELRL_TOPOLOGY_TESTS=1",
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "PYTHONUNBUFFERED": "1",
        "WANDB_MODE": "offline",
    }


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """One generation server for the module, started as `kernelrl topology` starts it
    (KERNELRL_TEST_VLLM_PORT: use a `kernelrl serve` already running on that port)."""
    if os.environ.get("KERNELRL_TEST_VLLM_PORT"):
        port = int(os.environ["KERNELRL_TEST_VLLM_PORT"])
        yield f"http://127.0.0.1:{port}", port
        return
    port = _free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    command = [sys.executable, "-m", "kernelrl.launch.cli", "serve"]
    command += ["--model", "smollm2-135m-instruct", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--dtype", "float32", "--enforce_eager", "--max_model_len", "2048"]
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=_env(), start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900
    try:
        while not _healthy(url):
            assert process.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "server not ready in 900 s"
            time.sleep(2)
        yield url, port
    finally:
        stop_session(process, grace_s=60)


def _hf_logprobs(model, prompt: list[int], completion: list[int]) -> torch.Tensor:  # noqa: ANN001
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return logits.log_softmax(-1).gather(1, torch.tensor(completion)[:, None])[:, 0]


def test_server_samples_from_the_new_weights_after_a_step(server, tmp_path: Path) -> None:  # noqa: ANN001
    """The trainer's own path (TRL's server-mode sync through the gloo client, once per step):
    before a step the server samples from the old weights, after it from the new ones."""
    from transformers import AutoTokenizer

    from kernelrl.data.schema import make_dataset
    from kernelrl.rl.config import KernelGRPOConfig
    from kernelrl.rl.trainer import KernelGRPOTrainer

    url, _ = server
    folder = smollm2_folder()
    args = KernelGRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        use_vllm=True,
        vllm_mode="server",
        vllm_server_base_url=url,
        vllm_group_port=_free_port(),
        model_init_kwargs={"dtype": "float32"},
        num_generations=2,
        per_device_train_batch_size=2,
        max_steps=1,
        temperature=1.0,  # the server's processed logprobs are then the policy's
        report_to=[],
        max_completion_length=8,
    )
    trainer = KernelGRPOTrainer(
        model=folder,
        args=args,
        train_dataset=make_dataset(task_rows(1), "tasks"),
        processing_class=AutoTokenizer.from_pretrained(folder, padding_side="left"),
        pool=VerdictPool(lambda *_: Status.FORMAT_ERROR),
    )
    try:
        tok = trainer.processing_class
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": "Write a haiku about kernels."}],
            tokenize=True,
            add_generation_prompt=True,
            return_dict=False,
        )
        model = trainer.model
        old = {k: v.clone() for k, v in model.state_dict().items()}

        def distance(logprobs: list, weights: dict, completion: list[int]) -> float:
            current = {k: v.clone() for k, v in model.state_dict().items()}
            model.load_state_dict(weights)
            hf = _hf_logprobs(model, prompt, completion)
            model.load_state_dict(current)
            return (torch.tensor(logprobs) - hf).abs().max().item()

        # step 0: the trainer pushes its (initial) weights, the server samples from them
        ids, lps = trainer._generate_tokens([prompt], 8, None)
        assert distance(lps[0], old, ids[0]) < TOLERANCE
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():  # stands in for an optimizer step: every weight moves
            for parameter in model.parameters():
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
        new = {k: v.clone() for k, v in model.state_dict().items()}
        assert distance(lps[0], new, ids[0]) > 3 * TOLERANCE  # the step changed the policy
        # same step: nothing pushed, the server still samples from the old weights
        stale_ids, stale = trainer._generate_tokens([prompt], 8, None)
        assert distance(stale[0], old, stale_ids[0]) < TOLERANCE
        # next step: pushed before generating, and the server samples from them
        trainer.state.global_step += 1
        new_ids, new_lps = trainer._generate_tokens([prompt], 8, None)
        assert distance(new_lps[0], new, new_ids[0]) < TOLERANCE
        assert distance(new_lps[0], old, new_ids[0]) > 3 * TOLERANCE
    finally:
        trainer.close()
        trainer.vllm_generation.vllm_client.close_communicator()


# ---------------------------------------------------------------------------- the topology
def _topology(
    tmp_path: Path, *, server_port: int | None, train_args: str, extra: list[str] = ()
) -> tuple[list[str], Path]:
    """The `kernelrl topology` command (free ports; logs and outputs under tmp_path)."""
    port = server_port or _free_port()
    train = f"--output_dir {tmp_path / 'out'} --vllm_server_port {port} "
    train += f"--vllm_group_port {_free_port()} --report_to none {train_args}"
    command = [sys.executable, "-m", "kernelrl.launch.cli", "topology"]
    command += ["--train_config", str(RECIPE)]
    command += ["--env_config", str(REPO / "recipes" / "env" / "local_cpu.yaml")]
    command += ["--num_processes", "2", "--ray_port", str(_free_port())]
    command += ["--main_process_port", str(_free_port()), "--log_dir", str(tmp_path / "logs")]
    command += ["--start_server", "false" if server_port else "true", *extra]
    return [*command, "--", *train.split()], tmp_path / "out"


def _run(command: list[str], timeout: float) -> subprocess.CompletedProcess:
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
        cwd=REPO,
        start_new_session=True,
    )
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_session(process, grace_s=60)
        out, _ = process.communicate()
        raise AssertionError(f"kernelrl topology hung for {timeout} s:\n{out[-4000:]}") from None
    return subprocess.CompletedProcess(command, process.returncode, out)


def _summary(out: Path) -> dict:
    return json.loads((out / "train_summary.json").read_text())


def test_one_server_mode_step_with_two_ranks(server, tmp_path: Path) -> None:  # noqa: ANN001
    """CI's end-to-end run: Ray head, environment service, two trainer ranks (DDP on gloo)
    reaching the server and the service over loopback; one multi-turn TRLOO step whose
    weights are pushed into the server, every process stopped at the end."""
    _, port = server
    command, out = _topology(
        tmp_path,
        server_port=port,
        train_args="--max_steps 1 --max_turns 2 --max_completion_length 48 "
        "--max_feedback_tokens 48 --save_strategy no",
    )
    done = _run(command, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:]
    summary = _summary(out)
    assert summary["global_step"] == 1 and summary["num_processes"] == 2
    assert "reward" in summary["last_log"] and "turns/mean" in summary["last_log"]
    assert "environment service and generation server ready" in done.stdout
    pids = json.loads((tmp_path / "logs" / "pids.json").read_text())
    deadline = time.monotonic() + 30  # exited children may stay zombies until reaped
    while (alive := _alive_in_groups(pids.values())) and time.monotonic() < deadline:
        time.sleep(1)
    assert not alive, f"processes left behind: {alive}"
    assert not _leftovers(tmp_path), "processes left behind"


def _alive_in_groups(groups: object) -> list[int]:
    """Processes of these process groups that are running (not zombies)."""
    wanted = set(groups)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) in wanted:
            found.append(int(entry.name))
    return found


def _leftovers(folder: Path) -> list[str]:
    """Processes that still name this test's folder (the service, the trainers)."""
    marker = str(folder).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker in (entry / "cmdline").read_bytes():
                    found.append((entry / "cmdline").read_bytes().decode(errors="replace"))
            except OSError:
                continue
    return found


def _wait_for(path: Path, process: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, f"the topology ended before {path} appeared"
        assert time.monotonic() < deadline, f"{path} did not appear in {timeout} s"
        time.sleep(2)


def _wait_for_complete_checkpoint(out: Path, process: subprocess.Popen, timeout: float) -> None:
    """Until both ranks have finished writing a checkpoint (a folder appears before it is)."""
    from kernelrl.launch.recipe import last_complete_checkpoint
    from kernelrl.rl.trainer import STATE_FILE

    deadline = time.monotonic() + timeout
    while last_complete_checkpoint(str(out), [STATE_FILE], world_size=2) is None:
        assert process.poll() is None, "the topology ended before a complete checkpoint"
        assert time.monotonic() < deadline, f"no complete checkpoint in {timeout} s"
        time.sleep(2)


def _background(command: list[str], log: Path) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_env(),
            cwd=REPO,
            start_new_session=True,
        )


def _finish(process: subprocess.Popen, timeout: float) -> int:
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_session(process, grace_s=60)
        raise AssertionError(f"no exit within {timeout} s after the fault: a hang") from None


def _process_with(root: int, marker: bytes, where: str = "environ") -> int:
    """The process under ``root`` (torchrun's ranks and Ray's workers leave its group) whose
    /proc file holds ``marker``."""
    from kernelrl.launch.reaper import descendants

    for pid, _ in descendants(root):
        try:
            if marker in Path(f"/proc/{pid}/{where}").read_bytes():
                return pid
        except OSError:
            continue
    raise AssertionError(f"no process under {root} with {marker!r} in its {where}")


STEPS = "--max_steps 3 --max_completion_length 96 --max_feedback_tokens 64"


@LONG
def test_three_steps_then_resume_the_whole_topology(tmp_path: Path) -> None:
    """The documented launch, server included: 3 steps, the server's weights updated before
    every step's generation, a checkpoint per step; then the whole topology brought back from
    the last checkpoint for a fourth step."""
    command, out = _topology(tmp_path, server_port=None, train_args=STEPS)
    done = _run(command, timeout=2400)
    assert done.returncode == 0, done.stdout[-4000:]
    assert _summary(out)["global_step"] == 3
    assert all((out / f"checkpoint-{s}" / "kernelrl_state_1.pt").exists() for s in (1, 2, 3))
    updates = re.findall(
        r"kernelrl gloo weight update (\d+): (\d+) tensors",
        (tmp_path / "logs" / "server.log").read_text(),
    )
    assert len(updates) == 3 and all(int(n) > 0 for _, n in updates)
    again, _ = _topology(
        tmp_path,
        server_port=None,
        train_args=STEPS.replace("--max_steps 3", "--max_steps 4"),
        extra=["--resume_from_checkpoint", "latest"],
    )
    done = _run(again, timeout=2400)
    assert done.returncode == 0, done.stdout[-4000:]
    assert _summary(out)["global_step"] == 4


@LONG
def test_env_service_restarted_mid_step_is_resubmitted(tmp_path: Path) -> None:
    """The service's actor process dies during step 2; Ray restarts it and the trainers
    resubmit what was in flight: the run ends normally, every reward a real evaluation's."""
    command, out = _topology(tmp_path, server_port=None, train_args=STEPS)
    process = _background(command, tmp_path / "console.log")
    _wait_for(out / "checkpoint-1", process, 1800)
    pids = json.loads((tmp_path / "logs" / "pids.json").read_text())
    service = _process_with(pids["ray"], b"ray::EnvService", where="cmdline")
    os.kill(service, signal.SIGKILL)
    code = _finish(process, 1800)
    console = (tmp_path / "console.log").read_text()
    assert code == 0, console[-4000:]
    assert "environment service 'kernelrl-env' is back; resubmitting" in console
    assert _summary(out)["global_step"] == 3


@LONG
def test_generation_server_killed_mid_step_is_one_line_then_resumes(tmp_path: Path) -> None:
    command, out = _topology(tmp_path, server_port=None, train_args=STEPS)
    process = _background(command, tmp_path / "console.log")
    _wait_for(out / "checkpoint-1", process, 1800)
    pids = json.loads((tmp_path / "logs" / "pids.json").read_text())
    os.killpg(pids["server"], signal.SIGKILL)
    code = _finish(process, 600)
    lines = (tmp_path / "console.log").read_text().strip().splitlines()
    assert code == 1
    assert lines[-1].startswith("kernelrl topology: error: the trainers exited")
    assert "server (status" in lines[-1] and "--resume_from_checkpoint latest" in lines[-1]
    assert any(line.startswith("kernelrl train: error (rank 0):") for line in lines)
    again, _ = _topology(
        tmp_path, server_port=None, train_args=STEPS, extra=["--resume_from_checkpoint", "latest"]
    )
    done = _run(again, timeout=2400)
    assert done.returncode == 0, done.stdout[-4000:]
    assert _summary(out)["global_step"] == 3


@LONG
def test_trainer_rank_killed_is_one_line_then_resumes(tmp_path: Path) -> None:
    command, out = _topology(tmp_path, server_port=None, train_args=STEPS)
    process = _background(command, tmp_path / "console.log")
    _wait_for_complete_checkpoint(out, process, 1800)  # then rank 1 dies during step 2
    pids = json.loads((tmp_path / "logs" / "pids.json").read_text())
    os.kill(_process_with(pids["trainers"], b"\0RANK=1\0"), signal.SIGKILL)
    code = _finish(process, 600)
    lines = (tmp_path / "console.log").read_text().strip().splitlines()
    assert code == 1
    assert lines[-1].startswith("kernelrl topology: error: the trainers exited")
    again, _ = _topology(
        tmp_path, server_port=None, train_args=STEPS, extra=["--resume_from_checkpoint", "latest"]
    )
    done = _run(again, timeout=2400)
    assert done.returncode == 0, done.stdout[-4000:]
    assert _summary(out)["global_step"] == 3
