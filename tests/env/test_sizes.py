"""Footprints measured on the meta device, and CPU sizes derived for tasks published too big.

The KernelBench tests read the checkout named by KERNELBENCH_DIR and are skipped without it:
  KERNELBENCH_DIR=path/to/KernelBench python -m pytest -q tests/env/test_sizes.py
"""

from __future__ import annotations

import dataclasses
import os
import resource
import time
from pathlib import Path

import pytest
import torch

from kernelrl.data.bundled import TASKS_DIR
from kernelrl.env import sizes
from kernelrl.env.reference import ReferenceRunner
from kernelrl.env.sizes import Footprint, derive_cpu_sizes, estimate_footprint
from kernelrl.env.task import Task, TaskError, load_task, load_task_folder, task_from_source

GIB = 2**30
KERNELBENCH = os.environ.get("KERNELBENCH_DIR")
needs_kernelbench = pytest.mark.skipif(not KERNELBENCH, reason="KERNELBENCH_DIR is not set")


@pytest.fixture(autouse=True)
def default_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(sizes.BUDGET_ENV, raising=False)


def task_of(body: str, task_id: str = "synthetic") -> Task:
    return task_from_source("import torch\nimport torch.nn as nn\n" + body, task_id)


def with_cpu_sizes(task: Task, overrides: dict) -> Task:
    return dataclasses.replace(task, sizes={**task.sizes, "cpu": overrides})


# 16 GiB at its published sizes: 8 GiB of input, 8 GiB of output, like KernelBench's level 1.
HUGE_RELU = """
class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)

batch_size = 65536
dim = 32768

def get_inputs():
    return [torch.rand(batch_size, dim)]

def get_init_inputs():
    return []
"""


# ---------------------------------------------------------------------------- footprints
@pytest.mark.parametrize(
    ("name", "kind", "expected"),
    [
        ("01_relu", "cuda", Footprint(4096 * 8192 * 4, 0, 4096 * 8192 * 4, 2**28, True)),
        ("01_relu", "cpu", Footprint(16 * 256 * 4, 0, 16 * 256 * 4, 2 * 16 * 256 * 4, True)),
        (  # nn.Linear(4096, 4096): weight and bias
            "21_linear",
            "cuda",
            Footprint(2048 * 4096 * 4, (4096 * 4096 + 4096) * 4, 2048 * 4096 * 4, 0, True),
        ),
        ("21_linear", "cpu", Footprint(40 * 56 * 4, (48 * 56 + 48) * 4, 40 * 48 * 4, 0, True)),
        (  # Conv2d(64, 128, 3, padding=1) on 16x64x56x56
            "23_conv2d_3x3",
            "cuda",
            Footprint(
                16 * 64 * 56 * 56 * 4, (128 * 64 * 9 + 128) * 4, 16 * 128 * 56 * 56 * 4, 0, True
            ),
        ),
        ("07_argmax_dim1", "cuda", Footprint(32 * 4096 * 256 * 4, 0, 32 * 256 * 8, 0, True)),
    ],
)
def test_footprint_of_bundled_tasks(name: str, kind: str, expected: Footprint) -> None:
    footprint = estimate_footprint(load_task(TASKS_DIR / f"{name}.py"), kind)
    total = expected.input_bytes + expected.param_bytes + expected.output_bytes
    assert footprint == dataclasses.replace(expected, total_bytes=total)


def test_footprint_of_16_gib_task_allocates_nothing_and_is_fast() -> None:
    task = task_of(HUGE_RELU)
    estimate_footprint(task, "cuda")  # first meta run in a process imports torch's meta kernels
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    footprint = estimate_footprint(task, "cuda")
    elapsed = time.perf_counter() - started
    assert footprint == Footprint(8 * GIB, 0, 8 * GIB, 16 * GIB, True)
    assert elapsed < 0.5, f"measuring took {elapsed:.3f} s"
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
    assert grown_kib < 100 * 1024  # ru_maxrss is in KiB on Linux


def test_forward_without_meta_kernels_is_estimated() -> None:
    task = task_of(
        """
class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return x[x > 0] * self.scale.sum()  # data-dependent shape: no meta kernel

def get_inputs():
    return [torch.rand(1000, 10)]

def get_init_inputs():
    return [25]
"""
    )
    inputs, params = 1000 * 10 * 4, 25 * 4
    expected = Footprint(inputs, params, inputs + params, 2 * (inputs + params), False)
    assert estimate_footprint(task, "cuda") == expected


def test_kernelbook_init_convention_is_measured() -> None:
    task = task_of(
        """
class Model(nn.Module):
    def __init__(self, dim, scale=1.0):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(dim))
        self.scale = scale

    def forward(self, x):
        return x * self.weight * self.scale

def get_inputs():
    return [torch.rand([4, 4, 4, 4])]

def get_init_inputs():
    return [[], {'dim': 4, 'scale': 3.0}]
"""
    )
    assert estimate_footprint(task, "cuda") == Footprint(1024, 16, 1024, 2064, True)


# ---------------------------------------------------------------------------- deriving
def test_huge_task_gets_cpu_sizes_that_fit_and_run() -> None:
    task = task_of(HUGE_RELU)
    overrides = sizes.size_overrides(task, "cpu")
    assert set(overrides) == {"batch_size", "dim"}
    assert all(v >= 1 and v & (v - 1) == 0 for v in overrides.values())  # powers of two stay
    footprint = estimate_footprint(task, "cpu")
    assert footprint.total_bytes <= sizes.DEFAULT_CPU_BUDGET_BYTES
    assert footprint.total_bytes > sizes.DEFAULT_CPU_BUDGET_BYTES // 4  # not needlessly small
    assert task.size_overrides("cuda") == {}  # the GPU keeps the published sizes
    (outputs,) = ReferenceRunner(torch.device("cpu")).outputs(task, 0, [1])
    assert outputs[0].shape == (overrides["batch_size"], overrides["dim"])


def test_budget_is_configurable(monkeypatch: pytest.MonkeyPatch) -> None:
    task = task_of(HUGE_RELU)
    small = derive_cpu_sizes(task, 2**16)
    monkeypatch.setenv(sizes.BUDGET_ENV, "64")
    large = derive_cpu_sizes(task)
    assert estimate_footprint(with_cpu_sizes(task, small), "cpu").total_bytes <= 2**16
    footprint = estimate_footprint(with_cpu_sizes(task, large), "cpu").total_bytes
    assert 16 * 2**20 < footprint <= 64 * 2**20


def test_dependent_globals_follow_and_structure_is_kept() -> None:
    # bias_shape is computed from out_channels; kernel_size, stride and groups are structure.
    task = task_of(
        """
class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, groups, bias_shape):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride, groups=groups)
        self.norm = nn.GroupNorm(groups, out_channels)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        return self.norm(self.conv(x)) + self.bias

batch_size = 64
in_channels = 96
out_channels = 192
height = width = 512
kernel_size = 3
stride = 2
groups = 24
bias_shape = (out_channels, 1, 1)

def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]

def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, groups, bias_shape]
"""
    )
    budget = 2**20
    overrides = derive_cpu_sizes(task, budget)
    assert not {"kernel_size", "stride", "groups"} & set(overrides)
    channels = overrides.get("out_channels", 192)
    assert overrides.get("bias_shape", (192, 1, 1)) == (channels, 1, 1)
    assert channels % 24 == 0 and overrides.get("in_channels", 96) % 24 == 0
    derived = with_cpu_sizes(task, overrides)
    assert estimate_footprint(derived, "cpu").total_bytes <= budget
    (outputs,) = ReferenceRunner(torch.device("cpu")).outputs(derived, 0, [1])
    assert outputs[0].shape[1] == channels


def test_declared_cpu_sizes_are_kept() -> None:
    relu = load_task(TASKS_DIR / "01_relu.py")
    assert derive_cpu_sizes(relu, 1) == {"batch_size": 16, "dim": 256}
    # "cpu": {} declares that the published sizes are fine, however large.
    task = task_of(HUGE_RELU + '\nKERNELRL = {"sizes": {"cpu": {}}}\n')
    assert sizes.size_overrides(task, "cpu") == {}
    small = task_of(HUGE_RELU.replace("65536", "4").replace("32768", "4"))
    assert sizes.size_overrides(small, "cpu") == {}  # fits as published: nothing to derive


def test_task_that_cannot_shrink_gets_one_line_error() -> None:
    # Sizes written as literals: there is no global to halve.
    task = task_of(HUGE_RELU.replace("torch.rand(batch_size, dim)", "torch.rand(65536, 32768)"))
    with pytest.raises(TaskError) as caught:
        sizes.size_overrides(task, "cpu")
    message = str(caught.value)
    assert "\n" not in message
    assert "16.0 GiB" in message and 'KERNELRL = {"sizes": {"cpu"' in message
    assert estimate_footprint(task, "cuda").total_bytes == 16 * GIB  # GPU admission still works
    # The trusted reference runner reports it instead of allocating 16 GiB.
    with pytest.raises(TaskError, match="over the CPU budget"):
        ReferenceRunner(torch.device("cpu")).outputs(task, 0, [1])


def test_evaluator_reports_the_task_error_without_allocating() -> None:
    from kernelrl.env.evaluator import EvalConfig
    from kernelrl.env.pools.local import LocalPool

    task = task_of(HUGE_RELU.replace("torch.rand(batch_size, dim)", "torch.rand(65536, 32768)"))
    solution = (Path(__file__).parents[2] / "data/solutions/triton/01_relu.py").read_text()
    with (
        LocalPool(EvalConfig(device="cpu", timeout_s=60), workers=1) as pool,
        pytest.raises(TaskError, match="over the CPU budget"),
    ):
        pool.evaluate([task], [solution])


# ---------------------------------------------------------------------------- KernelBench
@needs_kernelbench
def test_kernelbench_level1_and_level2_derive_or_say_why() -> None:
    budget = sizes.DEFAULT_CPU_BUDGET_BYTES
    tasks = [t for level in (1, 2) for t in load_task_folder(Path(KERNELBENCH) / f"level{level}")]
    assert len(tasks) == 200
    derived, fits, refused = 0, 0, []
    for task in tasks:
        published = estimate_footprint(task, "cuda")
        try:
            overrides = derive_cpu_sizes(task, budget)
        except TaskError as exc:
            assert "\n" not in str(exc) and "KERNELRL" in str(exc)
            refused.append(str(exc))
            continue
        footprint = estimate_footprint(with_cpu_sizes(task, overrides), "cpu")
        assert footprint.total_bytes <= budget, (task.id, overrides)
        assert footprint.exact == published.exact, task.id  # forward still runs on meta
        derived += bool(overrides)
        fits += not overrides
    print(f"\nKernelBench L1+L2 at {budget >> 20} MiB: {derived} derived, {fits} fit as published,")
    print(f"{len(refused)} refused" + "".join(f"\n  {m}" for m in refused))
    assert derived + fits >= 190


SAMPLE_L1 = [
    "1_Square_matrix_multiplication_",
    "4_Matrix_vector_multiplication_",
    "19_ReLU",
    "23_Softmax",
    "33_BatchNorm",
    "42_Max_Pooling_2D",
    "47_Sum_reduction_over_a_dimension",
    "54_conv_standard_3D__square_input__square_kernel",
    "63_conv_standard_2D__square_input__square_kernel",
    "89_cumsum",
    "97_ScaledDotProductAttention",
    "100_HingeLoss",
]


@needs_kernelbench
@pytest.mark.parametrize("name", SAMPLE_L1)
def test_kernelbench_reference_runs_on_cpu_at_derived_sizes(name: str) -> None:
    task = load_task(Path(KERNELBENCH) / "level1" / f"{name}.py")
    assert estimate_footprint(task, "cuda").total_bytes > 16 * sizes.DEFAULT_CPU_BUDGET_BYTES
    runner = ReferenceRunner(torch.device("cpu"))
    started = time.perf_counter()
    (outputs,) = runner.outputs(task, 0, [1])  # real tensors, at the sizes size_overrides gives
    elapsed = time.perf_counter() - started
    assert elapsed < 5, f"{name}: reference took {elapsed:.1f} s"
    nbytes = sum(t.numel() * t.element_size() for t in outputs if isinstance(t, torch.Tensor))
    assert 0 < nbytes <= sizes.DEFAULT_CPU_BUDGET_BYTES
