"""An untrusted task's code (a client's inline task) runs only in the sandbox, and is still judged
against: its reference runs in a sandboxed child (env/sandboxed_reference.py), and every
trusted-side component that would execute task code refuses it.

The task below does at module level what a hostile task would: it writes a file where the
worker could and reads a secret from the worker's environment. Where that secret is visible its
reference is wrong, so a verdict computed with a reference run in the worker shows it too.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from kernelrl.env.admission import memory_plan
from kernelrl.env.evaluator import EvalConfig, Evaluator
from kernelrl.env.reference import ReferenceRunner, ReferenceTimingCache
from kernelrl.env.result import Status, TimingStats
from kernelrl.env.sandboxed_reference import SandboxedReference, _plan_of
from kernelrl.env.sizes import (
    cpu_size_overrides,
    derive_cpu_sizes,
    estimate_footprint,
    size_overrides,
)
from kernelrl.env.task import (
    TaskError,
    UntrustedTaskCode,
    load_task,
    task_from_row,
    task_from_source,
)
from kernelrl.env.timing import TimingConfig

ROOT = Path(__file__).resolve().parents[2]
RELU_TASK = load_task(ROOT / "data" / "tasks" / "01_relu.py")
RELU_SOLUTION = (ROOT / "data" / "solutions" / "triton" / "01_relu.py").read_text()
SECRET_VARIABLE = "KERNELRL_TEST_WORKER_SECRET"
SECRET = "fake-token-5f1c0e"

HOSTILE_TASK = """
import os
import pathlib

import torch
import torch.nn as nn

# Module-level code of a client's task: a marker file and the worker's environment.
_SEEN = os.environ.get("{variable}", "")
try:
    pathlib.Path({marker!r}).write_text("task code ran here; secret: " + _SEEN)
except OSError:
    pass
_SHIFT = 1.0 if _SEEN else 0.0  # the reference is wrong wherever the secret is visible


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(dim))

    def forward(self, x):
        return torch.relu(x) * self.scale + _SHIFT


batch_size = 8
dim = 64


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim]
"""

# Right only with the reference's parameters: the model seed must be the same on both sides.
SCALED_RELU_SOLUTION = """
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def scaled_relu_kernel(x_ptr, s_ptr, out_ptr, n, dim, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    s = tl.load(s_ptr + offs % dim, mask=mask)
    tl.store(out_ptr + offs, tl.maximum(x, THRESHOLD) * s, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(dim))

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        grid = (triton.cdiv(n, 1024),)
        scaled_relu_kernel[grid](x, self.scale, out, n, x.shape[-1], BLOCK=1024)
        return out
"""
RIGHT = SCALED_RELU_SOLUTION.replace("THRESHOLD", "0.0")
WRONG = SCALED_RELU_SOLUTION.replace("THRESHOLD", "0.1")


def hostile_source(marker: Path) -> str:
    return HOSTILE_TASK.format(variable=SECRET_VARIABLE, marker=str(marker))


# ---------------------------------------------------------------------------- no child needed
def test_trust_is_carried_and_keys_its_evaluations_apart() -> None:
    source = RELU_TASK.source
    untrusted = task_from_source(source, "client_relu", trusted=False)
    assert RELU_TASK.trusted and not untrusted.trusted
    assert RELU_TASK.hash == hashlib.sha256(source.encode()).hexdigest()[:16]  # as before
    assert untrusted.hash != RELU_TASK.hash  # no store or cache answers one for the other
    assert not untrusted.with_backend("cuda").trusted
    row = {"id": "client_relu", "source": source}
    assert not task_from_row(row, trusted=False).trusted
    assert task_from_row(row).hash == RELU_TASK.hash


def test_the_worker_refuses_to_run_an_untrusted_tasks_code(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    task = task_from_source(hostile_source(marker), "hostile", trusted=False)
    assert size_overrides(task, "cpu") == {}  # published sizes: nothing derived, nothing run
    runner = ReferenceRunner(torch.device("cpu"))
    refused = [
        lambda: runner.outputs(task, 0, [1]),
        lambda: runner.init_compute(task),
        lambda: runner.time(task, False, TimingConfig()),
        lambda: estimate_footprint(task, "cuda"),
        lambda: memory_plan(task, TimingConfig()),
        lambda: cpu_size_overrides(task),
        lambda: derive_cpu_sizes(task, 1),
        lambda: ReferenceTimingCache.key(task, torch.device("cpu"), "eager", TimingConfig()),
    ]
    for call in refused:
        with pytest.raises(UntrustedTaskCode, match="untrusted"):
            call()
    assert not marker.exists()
    # The same source, trusted, runs here: the guard is trust, not the code.
    trusted = task_from_source(hostile_source(marker), "hostile")
    assert runner.outputs(trusted, 0, [1])
    assert marker.exists()


def _reference(host_memory_bytes: int = 2**20) -> SandboxedReference:
    task = task_from_source(RELU_TASK.source, "client_relu", trusted=False)
    config = EvalConfig(device="cpu", host_memory_bytes=host_memory_bytes)
    return SandboxedReference(task, None, torch.device("cpu"), config)  # type: ignore[arg-type]


def test_what_a_reference_child_describes_is_checked_before_it_is_held() -> None:
    reference = _reference(host_memory_bytes=2**20)
    ok = reference._allocate(
        [
            {"kind": "tensor", "dtype": "float32", "shape": [4, 8], "nbytes": 128},
            {"kind": "value", "value": 3},
        ]
    )
    assert ok[0].shape == (4, 8) and ok[0].dtype == torch.float32 and ok[1] == 3
    with pytest.raises(TaskError, match="over the"):  # more than the worker holds for it
        reference._allocate(
            [{"kind": "tensor", "dtype": "float32", "shape": [2**20], "nbytes": 4 * 2**20}]
        )
    with pytest.raises(ValueError, match="malformed"):  # sizes that do not add up
        reference._allocate([{"kind": "tensor", "dtype": "float32", "shape": [4], "nbytes": 4}])
    with pytest.raises(TaskError, match="other than tensors"):
        reference._allocate([{"kind": "other", "type": "Foo"}])


def test_a_reference_childs_timing_and_footprint_are_read_field_by_field() -> None:
    good = {"median_ms": 1.0, "p25_ms": 0.9, "p75_ms": 1.1, "min_ms": 0.8, "max_ms": 2.0}
    read = TimingStats.from_report({**good, "reps": 30, "rel_err": 0.01}, 4)
    assert read.median_ms == 1.0 and read.placement_medians_ms == []
    for bad in ({"median_ms": 0.0}, {"median_ms": float("nan")}, {"max_ms": float("inf")}):
        with pytest.raises(ValueError):
            TimingStats.from_report({**good, "reps": 30, "rel_err": 0.01, **bad}, 4)
    with pytest.raises(KeyError):
        TimingStats.from_report(good, 4)
    footprint = {"input_bytes": 2**20, "param_bytes": 0, "output_bytes": 2**20}
    eight = TimingConfig(most_placements=8)
    plan, reference_bytes = _plan_of(footprint, 80 * 2**30, eight)
    # Both children and the reference's outputs of the checked calls made at once on the
    # worker, in one reservation, the solution's child timed on as many input sets as the
    # timing asks for at most.
    outputs = plan.outputs_ahead * 2**20
    assert plan.total_bytes == 2 * reference_bytes + outputs and plan.placements == 8
    alone, _ = _plan_of({"error": "no meta kernel"}, 80 * 2**30, eight)
    assert alone.total_bytes == 80 * 2**30 and alone.large and alone.placements == 1
    with pytest.raises(ValueError):
        _plan_of({"input_bytes": -1, "param_bytes": 0, "output_bytes": 0}, 80 * 2**30, eight)


# ---------------------------------------------------------------------------- the real Evaluator
@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One Evaluator on CPU, with a secret in the worker's environment, evaluating the hostile
    task as a client's (a right and a wrong solution), a broken client task, then, the secret
    gone, the bundled ReLU and the hostile task as trusted tasks of ours."""
    folder = tmp_path_factory.mktemp("untrusted")
    untrusted_marker, trusted_marker = folder / "untrusted_marker", folder / "trusted_marker"
    untrusted = task_from_source(hostile_source(untrusted_marker), "hostile", trusted=False)
    broken = task_from_source(
        "raise RuntimeError('the task refuses to load')\n" + RELU_TASK.source,
        "broken",
        trusted=False,
    )
    cache = ReferenceTimingCache(folder / "timings.json")
    config = EvalConfig(device="cpu", timeout_s=60, host_memory_bytes=4 * 2**30)
    patch = pytest.MonkeyPatch()
    patch.setenv(SECRET_VARIABLE, SECRET)
    found: dict[str, Any] = {"untrusted_marker": untrusted_marker, "cache": cache}
    try:
        with Evaluator(config, timing_cache=cache) as evaluator:
            found["right"] = evaluator.evaluate(untrusted, RIGHT)
            found["wrong"] = evaluator.evaluate(untrusted, WRONG)
            try:
                evaluator.evaluate(broken, RELU_SOLUTION)
            except TaskError as exc:
                found["broken"] = exc
            found["untrusted_marker_after"] = untrusted_marker.exists()
            patch.delenv(SECRET_VARIABLE)
            found["relu"] = evaluator.evaluate(RELU_TASK, RELU_SOLUTION)
            trusted = task_from_source(hostile_source(trusted_marker), "hostile_ours")
            found["trusted"] = evaluator.evaluate(trusted, RIGHT)
            found["trusted_marker"] = trusted_marker.exists()
            found["in_worker"] = set(evaluator.references.runner._modules)
            found["trusted_hash"] = trusted.hash
            found["untrusted_hash"] = untrusted.hash
    finally:
        patch.undo()
    return found


def test_an_untrusted_tasks_code_runs_only_in_the_sandbox(evaluated: dict[str, Any]) -> None:
    assert not evaluated["untrusted_marker_after"]  # written nowhere the worker can see
    for name in ("right", "wrong"):
        assert SECRET not in json.dumps(evaluated[name].to_dict())
    assert SECRET not in str(evaluated["broken"])
    assert evaluated["untrusted_hash"] not in {key for key, _ in evaluated["in_worker"]}


def test_an_untrusted_task_still_judges_solutions(evaluated: dict[str, Any]) -> None:
    right, wrong = evaluated["right"], evaluated["wrong"]
    assert right.status is Status.CORRECT, right.feedback
    assert right.input_sets_checked == 3
    assert right.ref_eager is not None and right.ref_eager.median_ms > 0  # the child's report
    assert wrong.status is Status.INCORRECT, wrong.feedback
    assert "values outside" in wrong.error


def test_an_untrusted_reference_that_fails_is_the_tasks_fault(evaluated: dict[str, Any]) -> None:
    error = str(evaluated["broken"])
    assert "task broken" in error and "the task refuses to load" in error


def test_an_untrusted_reference_timing_is_never_cached(evaluated: dict[str, Any]) -> None:
    keys = json.loads(evaluated["cache"].path.read_text())
    hashes = {key.split("|")[0] for key in keys}
    assert evaluated["untrusted_hash"] not in hashes
    assert {RELU_TASK.hash, evaluated["trusted_hash"]} <= hashes


def test_a_trusted_task_still_runs_its_reference_in_the_worker(evaluated: dict[str, Any]) -> None:
    assert evaluated["relu"].status is Status.CORRECT, evaluated["relu"].feedback
    assert evaluated["trusted"].status is Status.CORRECT, evaluated["trusted"].feedback
    assert evaluated["trusted_marker"]  # its module level ran in this process
    assert {RELU_TASK.hash, evaluated["trusted_hash"]} <= {h for h, _ in evaluated["in_worker"]}


def test_the_worker_holds_no_lock_while_an_untrusted_reference_computes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's GPU lock is taken for its own GPU work only: an untrusted reference's child
    runs the task's code, which could take as long as its limit allows, and every other
    evaluation's measurement would wait for the lock meanwhile. The worker holds it around
    the allocation and copies of that child's outputs, never while it waits on the child."""
    import contextlib

    from kernelrl.env.sandbox.session import SandboxSession

    task = task_from_source(hostile_source(tmp_path / "marker"), "hostile", trusted=False)
    held, waits, receive = [], [], SandboxSession.receive

    def noted_receive(self, *args, **kwargs):
        waits.append(bool(held))
        return receive(self, *args, **kwargs)

    monkeypatch.setattr(SandboxSession, "receive", noted_receive)
    with Evaluator(EvalConfig(device="cpu", timeout_s=60, spare_children=0)) as evaluator:
        guard = evaluator._trusted_gpu_work

        @contextlib.contextmanager
        def noted_guard():
            with guard():
                held.append(True)
                yield
                held.pop()

        monkeypatch.setattr(evaluator, "_trusted_gpu_work", noted_guard)
        result = evaluator.evaluate(task, RIGHT)
    assert result.status is Status.CORRECT, result.feedback
    assert waits and not any(waits)
    assert not (tmp_path / "marker").exists()


@pytest.mark.gpu
def test_an_untrusted_task_on_a_gpu(tmp_path: Path) -> None:
    """On a GPU the reference's child reports the footprint its memory is admitted by, and
    times the reference itself inside the solution's measurement (the other children paused)."""
    task = task_from_source(hostile_source(tmp_path / "marker"), "hostile", trusted=False)
    cache = ReferenceTimingCache(tmp_path / "timings.json")
    with Evaluator(EvalConfig(device="cuda", timeout_s=120), timing_cache=cache) as evaluator:
        right = evaluator.evaluate(task, RIGHT)
        wrong = evaluator.evaluate(task, WRONG)
        budget = evaluator.gpu_memory
    assert budget is not None and budget.reserved == 0  # both children's memory given back
    assert right.status is Status.CORRECT, right.feedback
    assert wrong.status is Status.INCORRECT, wrong.feedback
    assert right.ref_eager is not None and right.ref_compile is None
    assert right.speedup_vs_eager is not None or not right.timing_meaningful
    assert not (tmp_path / "marker").exists()
    assert not cache.path.exists()
