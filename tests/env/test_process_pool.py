"""ProcessPool (``env_pool: process``): LocalPool's contract from a process of its own, and its
death answered as ours, never the kernel's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kernelrl.env.evaluator import EvalConfig
from kernelrl.env.pools import Pool
from kernelrl.env.pools.factory import EnvPoolConfig
from kernelrl.env.pools.process import ProcessPool
from kernelrl.env.result import POOL_ERROR_KEY, Status
from kernelrl.env.task import TaskError, load_task, task_from_source

ROOT = Path(__file__).resolve().parents[2]
RELU = load_task(ROOT / "data" / "tasks" / "01_relu.py")
GOOD = (ROOT / "data" / "solutions" / "triton" / "01_relu.py").read_text()
DYNAMIC = Path(__file__).parents[1] / "solutions" / "dynamic"
SEGFAULT = (DYNAMIC / "runtime_error__segfault.py").read_text()
HANG = (DYNAMIC / "timeout__infinite_loop.py").read_text()


@pytest.fixture(scope="module")
def pool() -> ProcessPool:
    with ProcessPool(EvalConfig(device="cpu", timeout_s=60), workers=2) as pool:
        yield pool


def test_it_keeps_the_pool_contract_and_evaluates_elsewhere(pool: ProcessPool) -> None:
    assert isinstance(pool, Pool)
    assert pool.device == "cpu" and pool.device_name and pool.versions and pool.num_slots == 2
    results = pool.evaluate([RELU, RELU, RELU], [GOOD, SEGFAULT, GOOD], timeout_s=300)
    assert [r.status for r in results] == [Status.CORRECT, Status.RUNTIME_ERROR, Status.CORRECT]
    # no slot thread, no sandbox child of this process: the evaluations ran in the pool's
    assert not [t for t in threading.enumerate() if t.name.startswith("kernelrl-slot")]
    assert pool._process.pid != os.getpid()


def test_a_broken_task_fails_its_own_future_only(pool: ProcessPool) -> None:
    broken = task_from_source(
        RELU.source.replace("return torch.relu(x)", "return torch.relu(y)"), "broken"
    )
    futures = pool.submit([broken, RELU], [GOOD, GOOD])
    with pytest.raises(TaskError, match="reference fails to run"):
        futures[0].result(timeout=300)
    assert futures[1].result(timeout=300).status is Status.CORRECT


def test_the_batch_deadline_holds_across_the_pipe() -> None:
    with ProcessPool(EvalConfig(device="cpu", timeout_s=10), workers=1) as one_slot:
        (running,) = one_slot.submit([RELU], [HANG], timeout_s=4)
        (waiting,) = one_slot.submit([RELU], [GOOD], timeout_s=4)  # a later batch: it waits
        ran, waited = running.result(timeout=60), waiting.result(timeout=60)
        assert ran.status is Status.TIMEOUT and ran.sandbox[POOL_ERROR_KEY] == "batch_timeout"
        assert waited.status is Status.HARNESS_ERROR and not waited.scored


def test_its_death_is_our_failure_not_the_kernels() -> None:
    pool = ProcessPool(EvalConfig(device="cpu", timeout_s=60), workers=1)
    try:
        (slow,) = pool.submit([RELU], [HANG])
        os.kill(pool._process.pid, signal.SIGKILL)
        verdict = slow.result(timeout=60)
        assert verdict.status is Status.HARNESS_ERROR and not verdict.scored
        assert verdict.sandbox[POOL_ERROR_KEY] == "pool_process" and "exited" in verdict.error
        with pytest.raises(RuntimeError, match="exited"):
            pool.submit([RELU], [GOOD])
    finally:
        pool.close()


def test_a_recipe_names_it_and_it_counts_as_timing_on_local_gpus() -> None:
    keys = EnvPoolConfig(env_pool="process", env_device="cuda")
    assert keys.times_on_local_gpus()
    with pytest.raises(ValueError, match="env_pool must be one of"):
        EnvPoolConfig(env_pool="subprocess")


def test_a_main_module_it_cannot_import_is_a_clear_error() -> None:
    """Spawned, the pool process imports the caller's main module; from standard input there is
    none to import, and the caller is told so in one line, not with a pipe's EOFError."""
    code = (
        "from kernelrl.env.evaluator import EvalConfig\n"
        "from kernelrl.env.pools.process import ProcessPool\n"
        "ProcessPool(EvalConfig(device='cpu'), workers=1)\n"
    )
    run = subprocess.run(
        [sys.executable, "-"], input=code, capture_output=True, text=True, timeout=300
    )
    last = run.stderr.strip().splitlines()[-1]
    assert run.returncode != 0
    assert last.startswith("RuntimeError: the environment pool process exited before it started")
    assert "if __name__ == '__main__':" in last


@pytest.mark.gpu
def test_it_evaluates_on_a_gpu() -> None:
    """The pool process owns the GPU; the caller's process never touches CUDA for it."""
    with ProcessPool(EvalConfig(device="cuda", timeout_s=120), workers=1) as gpu_pool:
        assert gpu_pool.device == "cuda" and gpu_pool.sizing is not None
        results = gpu_pool.evaluate([RELU, RELU], [GOOD, SEGFAULT])
    assert [r.status for r in results] == [Status.CORRECT, Status.RUNTIME_ERROR]
