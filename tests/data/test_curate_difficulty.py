"""Difficulty tags: AST operators and categories, runtime buckets, pass rate through the pool."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelrl.data.bundled import TASKS_DIR
from kernelrl.data.curate.difficulty import (
    DifficultyConfig,
    infer_category,
    op_categories,
    runtime_bucket,
    structural_difficulty,
    tag_difficulty,
    task_ops,
)
from kernelrl.data.curate.normalize import normalize_tasks
from kernelrl.data.loaders import load_tasks
from kernelrl.env.evaluator import EvalConfig
from kernelrl.env.pools.local import LocalPool
from kernelrl.env.task import task_from_row

ROOT = Path(__file__).resolve().parents[2]
RAW = Path(__file__).parents[1] / "fixtures" / "curate" / "raw_tasks"


def test_ops_from_the_ast() -> None:
    mlp = task_ops((RAW / "03_mlp_block.py").read_text())
    assert mlp == ["*", "+", "gelu", "layernorm", "linear"]
    assert op_categories(mlp) == ["activation", "elementwise", "matmul", "normalization"]
    assert structural_difficulty(mlp) == "hard"
    gelu = task_ops((RAW / "01_gelu_tanh.py").read_text())
    assert gelu == ["gelu"] and structural_difficulty(gelu) == "easy"
    # the input generators (torch.randn) are not operators of the task
    assert "randn" not in gelu
    softmax = task_ops((RAW / "02_softmax_rows.py").read_text())
    assert softmax == ["softmax"] and structural_difficulty(softmax) == "medium"
    assert (
        infer_category(["+", "layernorm"]) == "fused"
        and infer_category(["gelu", "*"]) == "elementwise"
    )


def test_categories_of_the_bundled_suite() -> None:
    """Checked by hand against the task files: what kind of kernel each task needs."""
    tasks = load_tasks([f"kernelbench:{TASKS_DIR}"])
    tagged, _ = tag_difficulty(normalize_tasks(tasks)[0])
    by_id = {row["id"]: row for row in tagged}
    assert all(row["ops"] for row in tagged)
    expected = {
        "01_relu": ["activation"],
        "08_cumsum_rows": ["scan"],
        "11_rmsnorm": ["elementwise", "reduction"],  # written out: mean, rsqrt, multiply
        "12_group_norm": ["normalization"],
        "20_batched_matmul": ["matmul"],
        "23_conv2d_3x3": ["convolution"],
        "27_kl_div_softmax": ["loss", "softmax"],
        "30_scaled_qk_softmax": ["elementwise", "layout", "matmul", "softmax"],
        "31_conv2d_stride2_relu": ["activation", "convolution"],
    }
    assert {key: by_id[key]["op_categories"] for key in expected} == expected
    assert by_id["01_relu"]["difficulty"] == "easy" and by_id["18_matmul"]["difficulty"] == "medium"


def test_runtime_buckets() -> None:
    assert [runtime_bucket(x) for x in (None, 0.05, 0.5, 5.0, 50.0, 500.0)] == [
        None,
        "<0.1ms",
        "0.1-1ms",
        "1-10ms",
        "10-100ms",
        ">=100ms",
    ]


@pytest.mark.slow
def test_pass_rate_from_k_samples_through_the_pool() -> None:
    """A 'model' that answers once with the bundled solution and once with garbage: the real
    environment judges both, so the pass rate is 1/2 and the difficulty follows from it."""
    tasks, _ = normalize_tasks(load_tasks([f"kernelbench:{RAW}"]))
    tasks = tasks.filter(lambda row: row["id"] == "01_gelu_tanh")
    solution = (ROOT / "data" / "solutions" / "triton" / "02_gelu_tanh.py").read_text()
    seen: list[int] = []

    def generate(prompts, k):
        seen.append(k)
        assert "class Model" in prompts[0][-1]["content"]
        return [[f"```python\n{solution}```", "I cannot write this kernel."][:k] for _ in prompts]

    with LocalPool(EvalConfig(device="cpu", timeout_s=120), workers=1) as pool:
        tagged, report = tag_difficulty(
            tasks, DifficultyConfig(pass_rate_k=2, max_pass_rate=0.9), generate, pool
        )
    assert seen == [2]
    assert (
        tagged["pass_rate"] == [0.5]
        and tagged["pass_k"] == [2]
        and tagged["difficulty"] == ["easy"]
    )
    with LocalPool(EvalConfig(device="cpu", timeout_s=120), workers=1) as pool:
        _, report = tag_difficulty(
            tasks, DifficultyConfig(pass_rate_k=1, max_pass_rate=0.9), generate, pool
        )
    assert [r.reason for r in report.removed] == ["pass_rate_too_high"]


@pytest.mark.slow
def test_pass_rate_with_the_real_model_through_the_launcher() -> None:
    """`kernelrl curate` with pass_rate_model: SmolLM2 writes k answers per task, the pool
    judges them. 32 new tokens cannot hold a ModelNew, so every answer is a format error."""
    from kernelrl.data.curate.config import curate_config
    from kernelrl.launch.curate_cli import make_generate

    tasks, _ = normalize_tasks(load_tasks([f"kernelbench:{RAW}"]))
    tasks = tasks.filter(lambda row: row["id"] == "02_softmax_rows")
    config = curate_config(
        pass_rate_model="smollm2-135m-instruct", pass_rate_k=2, pass_rate_max_new_tokens=32
    )
    generate, client = make_generate(config)
    try:
        answers = generate(list(tasks["prompt"]), 2)
        assert (
            len(answers) == 1
            and len(answers[0]) == 2
            and all(isinstance(a, str) and a for a in answers[0])
        )
        with LocalPool(EvalConfig(device="cpu", timeout_s=60), workers=1) as pool:
            results = pool.evaluate([task_from_row(tasks[0])] * 2, answers[0])
            tagged, _ = tag_difficulty(tasks, DifficultyConfig(pass_rate_k=2), generate, pool)
    finally:
        client.close()
    assert [str(r.status) for r in results] == ["format_error", "format_error"]
    assert tagged["pass_rate"] == [0.0] and tagged["difficulty"] == ["hard"]
