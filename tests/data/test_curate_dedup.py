"""Dedup (computation signatures) and decontamination (weighted n-gram overlap)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from datasets import Dataset

from kernelrl.data.bundled import TASKS_DIR
from kernelrl.data.curate.decontaminate import (
    Benchmark,
    DecontaminateConfig,
    decontaminate,
    write_decontamination_report,
)
from kernelrl.data.curate.dedup import DedupConfig, dedup, write_dedup_report
from kernelrl.data.curate.dedup_signature import signature
from kernelrl.data.curate.normalize import normalize_tasks
from kernelrl.data.curate.tokens import normalized_tokens
from kernelrl.data.loaders import load_tasks

DATA = Path(__file__).parents[1] / "fixtures" / "curate"
RAW = DATA / "raw_tasks"


@pytest.fixture(scope="module")
def raw_tasks():
    tasks, _ = normalize_tasks(load_tasks([f"kernelbench:{RAW}"]))
    return tasks


def test_renaming_comments_and_sizes_do_not_change_tokens() -> None:
    original = (RAW / "01_gelu_tanh.py").read_text()
    renamed = (RAW / "05_gelu_renamed.py").read_text()
    assert original != renamed
    assert normalized_tokens(original) == normalized_tokens(renamed)
    # the operator is kept: relu is not gelu
    assert normalized_tokens(
        original.replace('F.gelu(x, approximate="tanh")', "F.relu(x)")
    ) != normalized_tokens(original)
    # numbers inside forward are kept (dim=0 and dim=1 are different tasks), sizes are not
    softmax = (RAW / "02_softmax_rows.py").read_text()
    assert normalized_tokens(softmax.replace("dim=-1", "dim=0")) != normalized_tokens(softmax)
    assert normalized_tokens(softmax.replace("rows = 4096", "rows = 512")) == normalized_tokens(
        softmax
    )


def test_dedup_removes_renamed_copy_and_near_duplicate(raw_tasks) -> None:
    kept, report = dedup(raw_tasks, DedupConfig())
    removed = {r.id: r for r in report.removed}
    assert set(removed) == {"05_gelu_renamed", "09_mlp_block_variant"}
    assert removed["05_gelu_renamed"].reason == "exact_duplicate"
    assert removed["05_gelu_renamed"].data["duplicate_of"] == "01_gelu_tanh"
    near = removed["09_mlp_block_variant"]
    assert near.reason == "near_duplicate" and near.data["duplicate_of"] == "03_mlp_block"
    assert 0.8 <= near.data["similarity"] < 1.0
    assert (report.count_in, report.count_out) == (len(raw_tasks), len(raw_tasks) - 2)
    assert "01_gelu_tanh" in kept["id"] and "03_mlp_block" in kept["id"]


def test_dedup_keeps_every_distinct_bundled_task() -> None:
    """The 31 bundled tasks are all different computations: none may be called a duplicate."""
    tasks = load_tasks([f"kernelbench:{TASKS_DIR}"])
    kept, report = dedup(tasks, DedupConfig())
    assert report.removed == [] and len(kept) == len(tasks) == 31


def test_decontamination_removes_copied_task_and_reports_why(raw_tasks, tmp_path: Path) -> None:
    benchmark = Benchmark.from_sources([f"kernelbench:{DATA / 'benchmark'}"], DecontaminateConfig())
    kept, report = decontaminate(raw_tasks, benchmark)
    assert [r.id for r in report.removed] == ["08_rms_norm_channels"]
    removal = report.removed[0]
    assert (
        removal.reason == "contaminated"
        and removal.data["benchmark_id"] == "level1/36_channel_rms_scale"
    )
    assert removal.data["score"] == pytest.approx(1.0)
    assert "08_rms_norm_channels" not in kept["id"] and len(kept) == len(raw_tasks) - 1
    write_decontamination_report(report, tmp_path / "decontamination.md")
    text = (tmp_path / "decontamination.md").read_text()
    assert (
        "| 08_rms_norm_channels | level1/36_channel_rms_scale | 1.00 |" in text and "yes |" in text
    )


def test_decontamination_does_not_flag_different_tasks() -> None:
    """Each bundled task against the other 30 as the benchmark: no false contamination."""
    files = sorted(TASKS_DIR.glob("*.py"))
    sources = {f.stem: f.read_text() for f in files}
    config = DecontaminateConfig()
    worst = 0.0
    for task_id, source in sources.items():
        benchmark = Benchmark([(k, v) for k, v in sources.items() if k != task_id], config)
        match = benchmark.best_match(source)
        worst = max(worst, match["score"] if match else 0.0)
    assert worst < config.decontam_threshold
    # and the same benchmark catches a renamed copy
    benchmark = Benchmark(list(sources.items()), config)
    copy = re.sub(r"\bx\b", "logits", sources["14_softmax_rows"]).replace("batch_size", "n")
    assert copy != sources["14_softmax_rows"]
    assert benchmark.best_match(copy)["benchmark_id"] == "14_softmax_rows"
    assert benchmark.best_match(copy)["score"] >= config.decontam_threshold


# ------------------------------------------------- dedup compares computations, not text

DOC = '''"""
    Simple model that performs a standard convolution operation with a square input and kernel.

    Args:
        in_channels (int): Number of channels in the input tensor.
        out_channels (int): Number of channels produced by the convolution.
    """'''

SHELL = '''import torch
import torch.nn as nn

class Model(nn.Module):
    {doc}
    def __init__(self, {init_args}):
        super(Model, self).__init__()
        {init}

    def forward(self, {args}):
        """Performs the operation; see the class docstring."""
        {forward}

{sizes}

def get_inputs():
    {inputs}

def get_init_inputs():
    {init_inputs}
'''


def task(**parts: str) -> str:
    return SHELL.format(doc=DOC, **parts)


CONV = dict(
    init_args="in_channels, out_channels, kernel_size",
    args="x",
    forward="return self.conv(x)",
    init_inputs="return [in_channels, out_channels, kernel_size]",
)
PAIRS = {
    "conv2d_vs_conv3d": (
        task(
            **CONV,
            init="self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)",
            sizes="in_channels = 3\nout_channels = 64\nkernel_size = 3",
            inputs="return [torch.randn(16, in_channels, 32, 32)]",
        ),
        task(
            **CONV,
            init="self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)",
            sizes="in_channels = 3\nout_channels = 64\nkernel_size = 3",
            inputs="return [torch.randn(16, in_channels, 32, 32)]",
        ),
    ),
    "depthwise_vs_standard": (
        task(
            **CONV,
            init="self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)",
            sizes="in_channels = 64\nout_channels = 64\nkernel_size = 3",
            inputs="return [torch.randn(16, in_channels, 32, 32)]",
        ),
        task(
            **CONV,
            init="self.conv = nn.Conv2d(in_channels, in_channels, kernel_size, groups=in_channels)",
            sizes="in_channels = 64\nout_channels = 64\nkernel_size = 3",
            inputs="return [torch.randn(16, in_channels, 32, 32)]",
        ),
    ),
    "tall_skinny_vs_square_matmul": (
        task(
            init_args="",
            init="pass",
            args="A, B",
            forward="return torch.matmul(A, B)",
            sizes="N = 2048",
            inputs="return [torch.randn(N, N), torch.randn(N, N)]",
            init_inputs="return []",
        ),
        task(
            init_args="",
            init="pass",
            args="A, B",
            forward="return torch.matmul(A, B)",
            sizes="M = 16384\nN = 16",
            inputs="return [torch.randn(M, N), torch.randn(N, M)]",
            init_inputs="return []",
        ),
    ),
    "rnn_output_vs_hidden_state": (
        task(
            init_args="n",
            init="self.gru = nn.GRU(n, n)",
            args="x, h0",
            forward="output, h_n = self.gru(x, h0)\n        return output",
            sizes="n = 128",
            inputs="return [torch.randn(512, 10, n), torch.randn(1, 10, n)]",
            init_inputs="return [n]",
        ),
        task(
            init_args="n",
            init="self.gru = nn.GRU(n, n)",
            args="x, h0",
            forward="output, h_n = self.gru(x, h0)\n        return h_n",
            sizes="n = 128",
            inputs="return [torch.randn(512, 10, n), torch.randn(1, 10, n)]",
            init_inputs="return []",
        ),
    ),
    "softmax_dim0_vs_dim1": (
        task(
            init_args="",
            init="pass",
            args="x",
            forward="return torch.softmax(x, dim=0)",
            sizes="n = 4096",
            inputs="return [torch.randn(n, n)]",
            init_inputs="return []",
        ),
        task(
            init_args="",
            init="pass",
            args="x",
            forward="return torch.softmax(x, dim=1)",
            sizes="n = 4096",
            inputs="return [torch.randn(n, n)]",
            init_inputs="return []",
        ),
    ),
}


def dataset_of(sources: dict[str, str]):
    rows = [{"id": k, "source": v} for k, v in sources.items()]
    return Dataset.from_list(rows)


@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_distinct_problems_sharing_the_docstring_are_kept(pair: str) -> None:
    first, second = PAIRS[pair]
    kept, report = dedup(dataset_of({"a": first, "b": second}), DedupConfig())
    assert report.removed == [] and len(kept) == 2
    # the old text-based comparison called most of them duplicates: the test can fail
    assert signature(first).computation != signature(second).computation or (
        signature(first).shapes != signature(second).shapes
    )


def test_copies_that_differ_in_text_only_are_removed() -> None:
    """Other docstrings, comments, names and annotations: the same computation."""
    base = PAIRS["conv2d_vs_conv3d"][0]
    copy = (
        base.replace(DOC, '"""A 2D convolution."""')
        .replace("self.conv", "self.layer")
        .replace("x)", "inp)")
        .replace("(self, x)", "(self, inp: torch.Tensor) -> torch.Tensor")
        .replace("return self.layer(x)", "return self.layer(inp)  # the conv")
    )
    assert copy != base
    kept, report = dedup(dataset_of({"a": base, "b": copy}), DedupConfig())
    assert [(r.id, r.reason, r.data["duplicate_of"]) for r in report.removed] == [
        ("b", "exact_duplicate", "a")
    ]


def test_shape_variants_are_an_option() -> None:
    square, tall = PAIRS["tall_skinny_vs_square_matmul"]
    data = dataset_of({"square": square, "tall": tall})
    kept, report = dedup(data, DedupConfig())
    assert len(kept) == 2
    assert report.notes["shape_variants"][0]["id"] == "tall"
    assert report.notes["shape_variants"][0]["same_computation_as"] == "square"
    kept, report = dedup(data, DedupConfig(dedup_shape_variants=True))
    assert [(r.id, r.reason) for r in report.removed] == [("tall", "shape_variant")]
    # conv2d vs conv3d stay apart even when shape variants merge
    conv2d, conv3d = PAIRS["conv2d_vs_conv3d"]
    kept, report = dedup(
        dataset_of({"a": conv2d, "b": conv3d}), DedupConfig(dedup_shape_variants=True)
    )
    assert report.removed == []


def test_dedup_report_lists_removals_and_variants(raw_tasks, tmp_path: Path) -> None:
    _, report = dedup(raw_tasks, DedupConfig())
    text = write_dedup_report(report, tmp_path / "dedup.md").read_text()
    assert "| 05_gelu_renamed | 01_gelu_tanh | 1.00 | exact_duplicate |" in text
    assert "| 09_mlp_block_variant | 03_mlp_block |" in text and "near_duplicate" in text


# Pairs of KernelBench tasks that are different kernel problems with much text in common.
KNOWN_DISTINCT = [
    ("level1", "54_conv_standard_3D__square_input__square_kernel", "63_conv_standard_2D__square_input__square_kernel"),
    ("level1", "55_conv_standard_2D__asymmetric_input__square_kernel", "59_conv_standard_3D__asymmetric_input__square_kernel"),
    ("level1", "63_conv_standard_2D__square_input__square_kernel", "82_conv_depthwise_2D_square_input_square_kernel"),
    ("level1", "1_Square_matrix_multiplication_", "9_Tall_skinny_matrix_multiplication_"),
    ("level1", "1_Square_matrix_multiplication_", "2_Standard_matrix_multiplication_"),
    ("level1", "44_Average_Pooling_1D", "46_Average_Pooling_3D"),
    ("level1", "57_conv_transposed_2D__square_input__square_kernel", "64_conv_transposed_1D"),
    ("level3", "39_GRU", "40_GRUHidden"),
    ("level3", "36_LSTMHn", "37_LSTMCn"),
    ("level3", "11_VGG16", "12_VGG19"),
    ("level3", "48_Mamba2ReturnY", "49_Mamba2ReturnFinalState"),
]  # fmt: skip


@pytest.mark.skipif(not os.environ.get("KERNELBENCH_DIR"), reason="KERNELBENCH_DIR not set")
def test_kernelbench_levels_1_to_3_keep_every_known_distinct_pair() -> None:
    root = Path(os.environ["KERNELBENCH_DIR"])
    tasks, _ = normalize_tasks(load_tasks([f"kernelbench:{root / f'level{n}'}" for n in (1, 2, 3)]))
    assert len(tasks) == 250
    kept, report = dedup(tasks, DedupConfig())
    ids = set(kept["id"])
    for _, a, b in KNOWN_DISTINCT:
        assert a in ids and b in ids, (a, b, [r for r in report.removed if r.id in (a, b)])
    # every removal the defaults make is a same-computation, same-shape copy
    for removal in report.removed:
        assert removal.reason in ("exact_duplicate", "near_duplicate")
    assert len(report.removed) <= 2
