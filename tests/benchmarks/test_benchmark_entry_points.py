"""One entry point per benchmark, parameterised by the machine: a GPU count given as a number or
``all`` resolves or fails with one line, what a benchmark records about its machine is there,
and the benchmarks that start themselves again in child processes (accelerate's ranks, the
KernelBench runner) start the entry script, not the module the code now lives in."""

from __future__ import annotations

import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import gpu_training_runner  # noqa: E402
import kernelbench_kb  # noqa: E402
import machine  # noqa: E402


def test_gpu_counts_resolve_or_fail_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    assert machine.resolve_gpus("3") == 3
    monkeypatch.setattr(machine, "gpu_count", lambda: 0)
    for bad, said in (("all", "no visible GPU"), ("two", "'two'"), ("0", "at least 1")):
        with pytest.raises(SystemExit) as raised:
            machine.resolve_gpus(bad)
        assert said in str(raised.value) and "\n" not in str(raised.value)
    monkeypatch.setattr(machine, "gpu_count", lambda: 4)
    assert machine.resolve_gpus("all") == 4


def test_the_machine_is_described_with_date_commit_and_versions() -> None:
    info = machine.describe()
    assert info["host_cores"] >= 1 and info["host_memory_gib"] >= 1
    assert info["torch"] and info["python"].count(".") == 2
    assert info["date"].endswith("UTC") and info["commit"]  # the tests run in a git checkout
    assert isinstance(info["gpus"], list)


def test_accelerate_starts_the_gpu_training_entry_script(tmp_path: Path) -> None:
    args = Namespace(
        work=str(tmp_path / "work"),
        out=str(tmp_path / "out"),
        deadline_s=60,
        num_processes=2,
        device="cpu",
        extra=["--seed", "1"],
    )
    runner = gpu_training_runner.Runner(args)
    argv, env = runner._command("sft_ddp", "ddp", "sft", "recipes/gpu/sft_tiny.yaml", ["--x", "1"])
    script = argv.index(str(BENCHMARKS / "gpu_training.py"))
    assert argv[script + 1 : script + 2] == ["entry"]
    assert argv[argv.index("--num_processes") + 1] == "2"
    assert argv[-4:] == ["--x", "1", "--seed", "1"]
    assert env["KERNELRL_BENCH_STAGE"] == "sft_ddp" and env["DS_ACCELERATOR"] == "cpu"
    # the script accelerate starts really has the entry command
    help_text = subprocess.run(
        [sys.executable, argv[script], "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "carry" in help_text and "prepare" in help_text


def test_kernelbench_phases_start_the_harness_runner() -> None:
    assert kernelbench_kb.HARNESS == BENCHMARKS / "kernelbench_harness.py"
    source = kernelbench_kb.HARNESS.read_text()
    assert '"--kb-runner"' in source and "kb_runner_main(args)" in source
