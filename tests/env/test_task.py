"""The task format: loading from a file, a folder, and an HF datasets record; bad tasks."""

from __future__ import annotations

from pathlib import Path

import datasets
import pytest
import torch

from kernelrl.data.bundled import TASKS_DIR, bundled_pairs, bundled_tasks
from kernelrl.env.reference import ReferenceRunner
from kernelrl.env.sandbox import harness
from kernelrl.env.task import (
    TaskError,
    init_args,
    load_task,
    load_task_folder,
    task_from_row,
    task_from_source,
)

CATEGORIES = {
    "elementwise",
    "reduction",
    "normalization",
    "softmax",
    "matmul",
    "convolution",
    "loss",
    "fused",
}


def test_bundled_suite_covers_every_category_with_solutions() -> None:
    tasks = bundled_tasks()
    assert len(tasks) >= 24
    assert {t.category for t in tasks} == CATEGORIES
    assert len(bundled_pairs("triton")) == len(tasks)
    for task in tasks:
        assert task.size_overrides("cpu"), f"{task.id} has no cpu size variant"


def test_load_task_reads_metadata_without_running_it(tmp_path: Path) -> None:
    source = (TASKS_DIR / "01_relu.py").read_text() + "\nraise SystemExit('executed')\n"
    path = tmp_path / "level2" / "5_relu.py"
    path.parent.mkdir()
    path.write_text(source)
    task = load_task(path)
    assert (task.id, task.category, task.level) == ("5_relu", "elementwise", 2)
    assert task.size_overrides("cpu") == {"batch_size": 16, "dim": 256}
    assert task.tolerances("float16") == (1e-2, 1e-2)


def test_folder_loads_in_natural_order(tmp_path: Path) -> None:
    source = (TASKS_DIR / "01_relu.py").read_text()
    for name in ("10_b.py", "2_a.py", "1_c.py"):
        (tmp_path / name).write_text(source)
    assert [t.id for t in load_task_folder(tmp_path)] == ["1_c", "2_a", "10_b"]


def test_dataset_record_kernelbench_fields() -> None:
    source = (TASKS_DIR / "01_relu.py").read_text()
    dataset = datasets.Dataset.from_list([{"code": source, "name": "19_ReLU", "level": 1}])
    (task,) = [task_from_row(row) for row in dataset]
    assert (task.id, task.level, task.source) == ("19_ReLU", 1, source)
    assert (task.category, task.backend) == ("elementwise", "triton")  # from KERNELRL
    assert task.size_overrides("cpu") == {"batch_size": 16, "dim": 256}
    nameless = task_from_row({"code": source}, backend="cuda")
    assert (nameless.id, nameless.backend) == (f"task_{task.hash[:8]}", "cuda")
    with pytest.raises(TaskError, match="needs 'id' and 'source'.*or 'code'"):
        task_from_row({"text": source})
    with pytest.raises(TaskError, match="KernelBench task, missing"):
        task_from_row({"code": "x = 1\n", "name": "not_a_task"})


def test_task_schema_row_columns_are_the_metadata() -> None:
    """A row of kernelrl's task schema (as curation writes it) is taken as it is: its columns
    win over the source's KERNELRL literal, ``sizes`` is JSON text or a mapping."""
    source = (TASKS_DIR / "01_relu.py").read_text()
    row = {
        "id": 7,
        "source": source,
        "backend": "cuda",
        "category": "fused",
        "atol": 0.5,
        "rtol": None,
        "sizes": '{"cpu": {"batch_size": 2, "dim": 8}}',
        "level": 3,
    }
    task = task_from_row(row)
    assert (task.id, task.backend, task.category, task.atol, task.rtol, task.level) == (
        "7",
        "cuda",
        "fused",
        0.5,
        None,
        3,
    )
    assert task.size_overrides("cpu") == {"batch_size": 2, "dim": 8}
    assert task_from_row(row, backend="triton").backend == "triton"
    bare = task_from_row({"id": "r", "source": source, "sizes": "", "backend": None})
    assert (bare.backend, bare.category, dict(bare.sizes)) == ("triton", "uncategorized", {})
    assert task_from_row({**row, "sizes": {"cuda": {"dim": 4}}}).size_overrides("cuda") == {
        "dim": 4
    }
    with pytest.raises(TaskError, match="needs an 'id' column"):
        task_from_row({"source": source})
    with pytest.raises(TaskError, match="'sizes' is not JSON"):
        task_from_row({**row, "sizes": "{cpu"})


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def broken(:\n", "does not parse"),
        ("import torch\nclass Model: pass\n", "missing get_init_inputs, get_inputs"),
        ((TASKS_DIR / "01_relu.py").read_text() + "\nKERNELRL = make()\n", "dict literal"),
        (
            (TASKS_DIR / "01_relu.py").read_text() + "\nKERNELRL = {'colour': 1}\n",
            "unknown KERNELRL keys",
        ),
    ],
)
def test_bad_tasks_get_clear_errors(tmp_path: Path, source: str, message: str) -> None:
    path = tmp_path / "bad.py"
    path.write_text(source)
    with pytest.raises(TaskError, match=message):
        load_task(path)


def test_missing_file_and_folder() -> None:
    with pytest.raises(TaskError, match="cannot read task"):
        load_task("/nonexistent/task.py")
    with pytest.raises(TaskError, match="does not exist"):
        load_task_folder("/nonexistent")


# A task in KernelBook's convention: get_init_inputs returns [args, kwargs].
KERNELBOOK_TASK = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim, scale=1.0):
        super().__init__()
        self.scale = scale
        self.weight = nn.Parameter(torch.randn(dim))

    def forward(self, x):
        return x * self.weight * self.scale


def get_inputs():
    return [torch.rand([4, 4, 4, 4])]


def get_init_inputs():
    return [[], {'dim': 4, 'scale': 3.0}]
"""

KERNELBOOK_SOLUTION = """
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, w_ptr, out_ptr, n, dim, scale, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    w = tl.load(w_ptr + offsets % dim, mask=mask)
    tl.store(out_ptr + offsets, x * w * scale, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, dim, scale=1.0):
        super().__init__()
        self.scale = scale
        self.weight = nn.Parameter(torch.randn(dim))

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        scale_kernel[(triton.cdiv(n, 64),)](
            x, self.weight, out, n, self.weight.numel(), self.scale, BLOCK=64
        )
        return out
"""


@pytest.mark.parametrize(
    ("init_inputs", "expected"),
    [
        ([], ([], {})),
        ([4, 8], ([4, 8], {})),
        ((4, 8), ([4, 8], {})),  # a tuple works as a list, as it did before
        ([[], {"dim": 4, "scale": 3.0}], ([], {"dim": 4, "scale": 3.0})),  # KernelBook
        (([2], {"bias": False}), ([2], {"bias": False})),
        ([[], {}], ([], {})),  # KernelBook's no-argument form
        # Not KernelBook: the first item is not a list, a key is not a string, three items.
        ([4, {"dim": 4}], ([4, {"dim": 4}], {})),
        ([[4], {1: 2}], ([[4], {1: 2}], {})),
        ([[4], {"dim": 4}, 5], ([[4], {"dim": 4}, 5], {})),
        ([(3, 3), 8], ([(3, 3), 8], {})),  # KernelBench: a kernel_size tuple, then an int
    ],
)
def test_init_args_tells_kernelbook_from_kernelbench(
    init_inputs: object, expected: tuple[list, dict]
) -> None:
    assert init_args(init_inputs) == expected


def test_kernelbook_task_builds_through_the_harness() -> None:
    module = harness.load_module(KERNELBOOK_TASK, "kernelrl_test_kernelbook_task")
    model = harness.build_model(module.Model, module, 7, torch.device("cpu"))
    assert model.scale == 3.0 and model.weight.shape == (4,)
    (x,) = harness.make_inputs(module, 1, torch.device("cpu"))
    torch.testing.assert_close(model(x), x * model.weight * 3.0)
    # The trusted reference runner, which reported "Tensor and dict" before, runs it too.
    task = task_from_source(KERNELBOOK_TASK, "kernelbook_scale")
    (outputs,) = ReferenceRunner(torch.device("cpu")).outputs(task, 7, [1])
    torch.testing.assert_close(outputs[0], x * model.weight * 3.0)


def test_kernelbook_task_evaluates_correct_on_cpu() -> None:
    from kernelrl.env.evaluator import EvalConfig
    from kernelrl.env.pools.local import LocalPool

    task = task_from_source(KERNELBOOK_TASK, "kernelbook_scale")
    with LocalPool(EvalConfig(device="cpu", timeout_s=60), workers=1) as pool:
        (result,) = pool.evaluate([task], [KERNELBOOK_SOLUTION])
    assert result.status == "correct", result.feedback


# KernelBench's level-1 BatchNorm task, small: KernelBench runs the reference in training mode
# (no .eval()), so the task means normalising with the batch's own statistics.
BATCHNORM_TASK = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, num_features):
        super().__init__()
        self.bn = nn.BatchNorm2d(num_features=num_features)

    def forward(self, x):
        return self.bn(x)


def get_inputs():
    return [torch.randn(4, 3, 5, 7) * 2.0 + 1.0]


def get_init_inputs():
    return [3]
"""

BATCHNORM_SOLUTION = """
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def batch_norm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, N, C, HW, eps, BATCH_STATS: tl.constexpr,
                      BLOCK: tl.constexpr):
    c = tl.program_id(0)
    count = N * HW
    mean = 0.0
    var = 1.0
    if BATCH_STATS:
        total = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, count, BLOCK):
            i = start + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + (i // HW) * C * HW + c * HW + i % HW, mask=i < count, other=0.0)
            total += x
        mean = tl.sum(total, axis=0) / count
        squares = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, count, BLOCK):
            i = start + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + (i // HW) * C * HW + c * HW + i % HW, mask=i < count, other=0.0)
            d = tl.where(i < count, x - mean, 0.0)
            squares += d * d
        var = tl.sum(squares, axis=0) / count
    scale = tl.load(w_ptr + c) / tl.sqrt(var + eps)
    shift = tl.load(b_ptr + c) - mean * scale
    for start in range(0, count, BLOCK):
        i = start + tl.arange(0, BLOCK)
        where = (i // HW) * C * HW + c * HW + i % HW
        x = tl.load(x_ptr + where, mask=i < count, other=0.0)
        tl.store(out_ptr + where, x * scale + shift, mask=i < count)


class ModelNew(nn.Module):
    def __init__(self, num_features):
        super().__init__()
        self.bn = nn.BatchNorm2d(num_features=num_features)

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n, c, h, w = x.shape
        batch_norm_kernel[(c,)](x, self.bn.weight, self.bn.bias, out, n, c, h * w, self.bn.eps,
                                BATCH_STATS=BATCH_STATS, BLOCK=64)
        return out


BATCH_STATS = True
"""


def test_batchnorm_task_is_judged_as_kernelbench_defines_it() -> None:
    """A BatchNorm solution that normalises with the batch's statistics is correct; one that
    uses the initial running statistics (what an eval-mode reference would compute) is not."""
    from kernelrl.env.evaluator import EvalConfig
    from kernelrl.env.pools.local import LocalPool

    module = harness.load_module(BATCHNORM_TASK, "kernelrl_test_batchnorm_task")
    assert harness.build_model(module.Model, module, 0, torch.device("cpu")).training
    task = task_from_source(BATCHNORM_TASK, "batchnorm")
    running_stats = BATCHNORM_SOLUTION.replace("BATCH_STATS = True", "BATCH_STATS = False")
    with LocalPool(EvalConfig(device="cpu", timeout_s=60), workers=1) as pool:
        batch, running = pool.evaluate([task, task], [BATCHNORM_SOLUTION, running_stats])
    assert batch.status == "correct", batch.feedback
    assert running.status == "incorrect", running.feedback
