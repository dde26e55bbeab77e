"""What a sweep reads: benchmarks (KernelBench layouts, local data only), selection, prompts,
fixed solutions, recipes and the ``kernelrl eval`` command line. Nothing is evaluated here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernelrl.data.bundled import TASKS_DIR
from kernelrl.env.integrity.static_checks import run_static_checks
from kernelrl.env.task import TaskError, task_from_source
from kernelrl.eval.benchmarks import (
    load_benchmark,
    load_kernelbench_dataset,
    load_kernelbench_folder,
    parse_id_ranges,
    problem_id,
    select_tasks,
)
from kernelrl.eval.clients import Request
from kernelrl.eval.config import EvalSweepConfig
from kernelrl.eval.fixed import FixedSolutions
from kernelrl.launch.cli import main
from kernelrl.prompts import (
    EXAMPLE_REFERENCE,
    EXAMPLE_SOLUTIONS,
    PromptBuilder,
    strip_metadata,
)

RELU = (TASKS_DIR / "01_relu.py").read_text()
GELU = (TASKS_DIR / "02_gelu_tanh.py").read_text()
ROW_SUM = (TASKS_DIR / "06_row_sum.py").read_text()


@pytest.fixture
def kernelbench_checkout(tmp_path: Path) -> Path:
    """A KernelBench repository layout with three problems over two levels."""
    root = tmp_path / "KernelBench-repo"
    level1, level2 = root / "KernelBench" / "level1", root / "KernelBench" / "level2"
    level1.mkdir(parents=True)
    level2.mkdir(parents=True)
    (level1 / "1_ReLU_.py").write_text(strip_metadata(RELU))
    (level1 / "2_GELU_tanh_.py").write_text(strip_metadata(GELU))
    (level1 / "10_Row_sum.py").write_text(strip_metadata(ROW_SUM))
    (level2 / "1_Row_sum_again.py").write_text(strip_metadata(ROW_SUM))
    return root


def kernelbench_rows(level: int) -> list[dict]:
    sources = [RELU, GELU] if level == 1 else [ROW_SUM]
    names = ["1_ReLU_", "2_GELU_tanh_"] if level == 1 else ["1_Row_sum_again"]
    return [
        {"code": strip_metadata(src), "level": level, "name": name, "problem_id": i + 1}
        for i, (src, name) in enumerate(zip(sources, names, strict=True))
    ]


def test_kernelbench_folder_layout(kernelbench_checkout: Path) -> None:
    tasks = load_kernelbench_folder(kernelbench_checkout)
    assert [t.id for t in tasks] == [
        "level1/1_ReLU_",
        "level1/2_GELU_tanh_",
        "level1/10_Row_sum",
        "level2/1_Row_sum_again",
    ]
    assert [t.level for t in tasks] == [1, 1, 1, 2]
    assert [problem_id(t) for t in tasks] == [1, 2, 10, 1]
    # the KernelBench/ folder itself works as well
    assert len(load_kernelbench_folder(kernelbench_checkout / "KernelBench")) == 4
    with pytest.raises(TaskError, match="not a KernelBench checkout"):
        load_kernelbench_folder(kernelbench_checkout / "KernelBench" / "level1")


def test_selection(kernelbench_checkout: Path) -> None:
    tasks = load_kernelbench_folder(kernelbench_checkout)
    assert [t.id for t in select_tasks(tasks, levels=[2])] == ["level2/1_Row_sum_again"]
    assert [t.id for t in select_tasks(tasks, levels=[1], problem_ids="1-2")] == [
        "level1/1_ReLU_",
        "level1/2_GELU_tanh_",
    ]
    assert [t.id for t in select_tasks(tasks, problem_ids="10")] == ["level1/10_Row_sum"]
    assert [t.id for t in select_tasks(tasks, task_regex="Row_sum")] == [
        "level1/10_Row_sum",
        "level2/1_Row_sum_again",
    ]
    assert len(select_tasks(tasks, max_tasks=3)) == 3
    assert parse_id_ranges("1-3, 7") == {1, 2, 3, 7}
    with pytest.raises(ValueError, match="cannot read"):
        parse_id_ranges("1-x")
    with pytest.raises(ValueError, match="task_regex"):
        select_tasks(tasks, task_regex="(")
    with pytest.raises(TaskError, match="no task"):
        load_benchmark("kernelbench", str(kernelbench_checkout), levels=[3])


def test_kernelbench_hf_dataset_layout_from_local_data(tmp_path: Path) -> None:
    """The hub's layout (splits level_1.., fields code/level/name/problem_id), saved locally."""
    import datasets

    data = datasets.DatasetDict(
        {
            "level_1": datasets.Dataset.from_list(kernelbench_rows(1)),
            "level_2": datasets.Dataset.from_list(kernelbench_rows(2)),
        }
    )
    data.save_to_disk(str(tmp_path / "kb"))
    tasks = load_kernelbench_dataset(str(tmp_path / "kb"))
    assert [t.id for t in tasks] == [
        "level1/1_ReLU_",
        "level1/2_GELU_tanh_",
        "level2/1_Row_sum_again",
    ]
    assert [t.level for t in tasks] == [1, 1, 2]
    only_two = load_benchmark("hf", str(tmp_path / "kb"), levels=[2])
    assert [t.id for t in only_two] == ["level2/1_Row_sum_again"]
    # one JSONL file of rows (level in each row); names without the problem number get it
    rows = kernelbench_rows(1) + kernelbench_rows(2)
    rows[0]["name"] = "ReLU_"
    (tmp_path / "kb.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = load_kernelbench_dataset(str(tmp_path / "kb.jsonl"), levels=[1])
    assert [t.id for t in tasks] == ["level1/1_ReLU_", "level1/2_GELU_tanh_"]


def test_unreachable_hub_is_one_clear_error(tmp_path: Path) -> None:
    # A fresh process: the hub's offline switch is read when huggingface_hub is imported.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    code = (
        "from kernelrl.eval.benchmarks import load_benchmark\n"
        "load_benchmark('hf', 'ScalingIntelligence/KernelBench')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "TaskError: cannot load dataset 'ScalingIntelligence/KernelBench'" in done.stderr
    assert "offline, point benchmark_path at a KernelBench checkout" in done.stderr


def test_bundled_suite_loads() -> None:
    tasks = load_benchmark("bundled", str(TASKS_DIR), task_regex="^0[1-3]_")
    assert [t.id for t in tasks] == ["01_relu", "02_gelu_tanh", "03_silu_fp16"]


# ------------------------------------------------------------------------------------- prompts
def test_prompt_in_kernelbench_style() -> None:
    task = task_from_source(RELU, "01_relu")
    prompt = PromptBuilder(backend="triton").first_prompt(task)
    assert prompt.startswith("Task: make a PyTorch module faster by writing Triton kernels")
    assert "torch.relu(x)" in prompt  # the reference
    assert "KERNELRL" not in prompt and "sizes" not in prompt  # evaluation metadata stays out
    assert "@triton.jit" in prompt and "def add_kernel" in prompt  # one-shot example
    assert prompt.rstrip().endswith("no test or benchmark code.")
    cuda = PromptBuilder(backend="cuda").first_prompt(task.with_backend("cuda"))
    assert "writing CUDA kernels" in cuda and "load_inline" in cuda and "@triton.jit" not in cuda
    bare = PromptBuilder(backend="triton", one_shot=False).first_prompt(task)
    assert "add_kernel" not in bare and "torch.relu(x)" in bare


def test_one_shot_examples_pass_the_static_checks() -> None:
    """The example a prompt shows must itself be an acceptable answer (the Triton one is also
    evaluated for correctness in test_eval_fixed.py)."""
    for backend in ("triton", "cuda"):
        failures = run_static_checks(EXAMPLE_SOLUTIONS[backend], backend, EXAMPLE_REFERENCE)
        assert failures == [], (backend, failures)


def test_template_override(tmp_path: Path) -> None:
    template = tmp_path / "prompt.txt"
    template.write_text(
        "Write $backend_name for:\n$reference\nExample:\n$example_solution\nCost: $$5"
    )
    builder = PromptBuilder.from_file(template, backend="triton")
    prompt = builder.first_prompt(task_from_source(RELU, "01_relu"))
    assert prompt.startswith("Write Triton for:\n")
    assert "torch.relu(x)" in prompt and "def add_kernel" in prompt and prompt.endswith("Cost: $5")
    # Template mistakes fail when the file is loaded, before any generation.
    template.write_text("$reference $unknown")
    with pytest.raises(ValueError, match=r"unknown placeholder \$unknown"):
        PromptBuilder.from_file(template)
    template.write_text("Write a kernel for {source}")
    with pytest.raises(ValueError, match=r"no \$reference placeholder"):
        PromptBuilder.from_file(template)
    with pytest.raises(ValueError, match="cannot read prompt template"):
        PromptBuilder.from_file(tmp_path / "missing.txt")


def test_refinement_conversation() -> None:
    task = task_from_source(RELU, "01_relu")
    builder = PromptBuilder(system_prompt="be brief", history_turns=1)
    attempts = [
        ("first try", "Your kernel failed to compile."),
        ("<think>draft</think>second try", "Your kernel ran but its output is wrong."),
    ]
    messages = builder.conversation(task, attempts)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[2]["content"] == "second try"  # reasoning is not carried over
    assert "output is wrong" in messages[3]["content"]
    assert "first try" not in json.dumps(messages)  # only the last attempt is shown
    full = PromptBuilder(history_turns=2).conversation(task, attempts)
    assert [m["role"] for m in full] == ["user", "assistant", "user", "assistant", "user"]
    assert PromptBuilder().conversation(task) == [
        {"role": "user", "content": PromptBuilder().first_prompt(task)}
    ]


def test_training_and_evaluation_revise_with_one_message() -> None:
    """A sweep's refinement turn says what a training rollout's later turn says, by default:
    one template, one key (``feedback_template``) in both recipes."""
    import dataclasses

    from kernelrl.prompts import FEEDBACK_TEMPLATE, revision_message
    from kernelrl.rl.config import KernelGRPOConfig

    def default(config: type, key: str) -> str:
        return next(f.default for f in dataclasses.fields(config) if f.name == key)

    assert default(KernelGRPOConfig, "feedback_template") == FEEDBACK_TEMPLATE
    assert default(EvalSweepConfig, "feedback_template") == FEEDBACK_TEMPLATE
    task = task_from_source(RELU, "01_relu")
    messages = PromptBuilder().conversation(task, [("try", "It failed to compile.")])
    assert messages[-1]["content"] == revision_message(FEEDBACK_TEMPLATE, "It failed to compile.")
    own = PromptBuilder(feedback_template="Fix it: {feedback}").conversation(task, [("a", "b")])
    assert own[-1]["content"] == "Fix it: b"
    with pytest.raises(ValueError, match="must contain {feedback}"):
        EvalSweepConfig(client="fixed", fixed_solutions=["x"], feedback_template="no slot")
    single = EvalSweepConfig(client="fixed", fixed_solutions=["x"])
    several = EvalSweepConfig(client="fixed", fixed_solutions=["x"], max_turns=3)
    assert "feedback_template" not in single.identity()  # no later turn to shape
    assert several.identity()["feedback_template"] == FEEDBACK_TEMPLATE


# ------------------------------------------------------------------------------- fixed solutions
def test_fixed_solutions_sources(tmp_path: Path) -> None:
    folder = tmp_path / "solutions"
    (folder / "level1" / "1_ReLU_").mkdir(parents=True)
    (folder / "01_relu.py").write_text("A")
    (folder / "01_relu__wrong.py").write_text("B")
    (folder / "level1" / "1_ReLU_" / "x.py").write_text("C")
    (folder / "level1" / "1_ReLU_" / "y.md").write_text("D")
    (folder / "README.md").write_text("not a solution")
    jsonl = tmp_path / "more.jsonl"
    rows = [
        {"task_id": "01_relu", "completion": "E"},
        {"task_id": "01_relu", "completion": "F", "sample": 0, "turn": 1},
        {"task_id": "unknown", "completion": "G"},
    ]
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fixed = FixedSolutions([folder, jsonl], ["01_relu", "level1/1_ReLU_"])
    # folder: 01_relu gets A, B (samples 0, 1); the JSONL continues at sample 2 with E, and F is
    # its turn-1 refinement
    assert fixed.samples_for("01_relu") == 3 and fixed.samples_for("level1/1_ReLU_") == 2
    assert fixed.available("01_relu", 2, 1) and not fixed.available("01_relu", 0, 1)
    requests = [
        Request("01_relu", 1, 0, [], 0),
        Request("01_relu", 2, 1, [], 0),
        Request("level1/1_ReLU_", 1, 0, [], 0),
    ]
    assert [g.text for g in fixed.generate(requests)] == ["B", "F", "D"]
    assert len(fixed.unmatched) == 2  # README.md and the unknown task


# --------------------------------------------------------------------------- recipes and the CLI
def test_config_validation() -> None:
    with pytest.raises(ValueError, match="fixed_solutions"):
        EvalSweepConfig(client="fixed")
    with pytest.raises(ValueError, match="model_name_or_path"):
        EvalSweepConfig(client="vllm")
    with pytest.raises(ValueError, match="benchmark must be one of"):
        EvalSweepConfig(benchmark="mystery", client="openai")
    config = EvalSweepConfig(client="openai", samples=4)
    assert config.pass_ks() == [1, 4]
    assert config.fingerprint() != EvalSweepConfig(client="openai", temperature=0.5).fingerprint()


def _run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    err = capsys.readouterr().err.strip()
    return code, err


@pytest.mark.parametrize(
    ("recipe", "extra", "message"),
    [
        (None, [], "does not exist"),
        ("output_dir: [unclosed\n", [], "malformed YAML"),
        (
            "client: fixed\nfixed_solutions: [x]\nnot_a_key: 1\n",
            [],
            "unknown key for `kernelrl eval`: not_a_key",
        ),
        (
            "client: fixed\nfixed_solutions: [x]\n",
            ["--not_a_flag", "1"],
            "unknown key for `kernelrl eval`: --not_a_flag",
        ),
        ("client: fixed\n", [], "fixed_solutions"),
        (
            "client: vllm\nmodel_name_or_path: m\nenv_pool: local\nenv_device: cuda\n",
            [],
            "set overlap: false",
        ),
    ],
)
def test_cli_recipe_errors_are_one_line_exit_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    recipe: str | None,
    extra: list[str],
    message: str,
) -> None:
    path = tmp_path / "recipe.yaml"
    if recipe is not None:
        path.write_text(recipe)
    code, err = _run_cli(["eval", "--config", str(path), *extra], capsys)
    assert code == 2
    assert message in err and err.startswith("kernelrl: error:") and len(err.splitlines()) == 1


def test_cli_usage_and_recipes_parse(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval"]) == 2
    assert "kernelrl eval compare RUN_A RUN_B" in capsys.readouterr().err
    from kernelrl.launch.eval_cli import parse_sweep_recipe as parse_recipe

    recipes = Path(__file__).resolve().parents[2] / "recipes" / "eval"
    smoke = parse_recipe(["--config", str(recipes / "smoke_cpu.yaml"), "--samples", "3"])
    assert (smoke.client, smoke.samples, smoke.max_turns, smoke.max_tokens) == ("vllm", 3, 2, 512)
    gpu = parse_recipe(["--config", str(recipes / "kernelbench_l1_triton.yaml")])
    assert (gpu.benchmark, gpu.levels, gpu.env_device, gpu.overlap) == (
        "kernelbench",
        [1],
        "cuda",
        False,
    )
    fixed = parse_recipe(["--config", str(recipes / "fixed_bundled.yaml")])
    assert fixed.fixed_solutions == ["bundled", "tests/solutions/eval"]
    code, err = _run_cli(["eval", "compare", "/nonexistent/a", "/nonexistent/b"], capsys)
    assert code == 2 and "not a sweep results folder" in err
