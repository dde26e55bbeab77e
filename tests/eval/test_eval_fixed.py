"""Fixed-solutions sweeps through the real environment on CPU, with metrics checked by hand.

Five bundled tasks; sample 0 of each is its bundled Triton solution (correct), sample 1 a
deliberately wrong one from tests/solutions/eval/<task id>/ whose file name states the expected
status:

    task              sample 0   sample 1
    01_relu           correct    incorrect            (leaky slope)
    02_gelu_tanh      correct    compile_error        (tl.gelu does not exist)
    06_row_sum        correct    integrity_violation  (torch.sum does the work; static check)
    14_softmax_rows   correct    format_error         (prose, no code)
    18_matmul         correct    runtime_error        (impossible view of the output)

By hand, over 10 attempts: parse 9/10 (all but the format error); compiled 7/10 (not: format
error, compile error, static integrity violation); correct 5/10; integrity violations 1/10;
pass@1 = mean of c/n = 1/2 on every task = 0.5; pass@2 = 1 on every task (n - c = 1 < 2);
fast_0 = 5/10; fast_p for p > 0 and speedups: n/a on CPU. Wilson 95% for 5/10:
z^2 = 3.841459, denominator 1.384146, center 0.5, half 1.959964 * sqrt(0.025 + 0.009604)
/ 1.384146 = 0.364592 / 1.384146 = 0.263407 -> [0.236593, 0.763407].

Evaluations go through a results store (the environment's CachedPool) shared by the module,
so a completion evaluated once is not evaluated again by a later test.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from concurrent.futures import Future
from pathlib import Path

import pytest

from kernelrl.data.bundled import SOLUTIONS_DIR, TASKS_DIR
from kernelrl.env.evaluator import EvalConfig
from kernelrl.env.pools.cached import CachedPool
from kernelrl.env.pools.local import LocalPool
from kernelrl.env.result import Status
from kernelrl.env.store import ResultsStore
from kernelrl.env.task import task_from_source
from kernelrl.eval.config import EvalSweepConfig
from kernelrl.eval.estimators import StatsConfig
from kernelrl.eval.fixed import FixedSolutions
from kernelrl.eval.metrics import sweep_summary
from kernelrl.eval.records import read_records
from kernelrl.eval.report import write_report
from kernelrl.eval.sweep import Sweep
from kernelrl.launch.cli import main
from kernelrl.launch.eval_cli import load_tasks
from kernelrl.prompts import EXAMPLE_REFERENCE, EXAMPLE_SOLUTIONS

pytestmark = pytest.mark.slow

WRONG = Path(__file__).resolve().parents[1] / "solutions" / "eval"
TASK_REGEX = "^(01_relu|02_gelu_tanh|06_row_sum|14_softmax_rows|18_matmul)$"


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("eval-store") / "results.sqlite"


@pytest.fixture(scope="module")
def pool(store_path: Path):
    inner = LocalPool(EvalConfig(device="cpu", timeout_s=120), workers=2)
    with CachedPool(inner, ResultsStore(store_path)) as cached:
        yield cached


@pytest.fixture(scope="module")
def fixed_run(tmp_path_factory: pytest.TempPathFactory, store_path: Path) -> Path:
    """The sweep, run as a user runs it: ``kernelrl eval --config recipes/eval/fixed_bundled.yaml``."""
    out = tmp_path_factory.mktemp("runs") / "fixed"
    recipe = Path(__file__).resolve().parents[2] / "recipes" / "eval" / "fixed_bundled.yaml"
    argv = ["eval", "--config", str(recipe), "--task_regex", TASK_REGEX, "--env_device", "cpu"]
    argv += ["--output_dir", str(out), "--fixed_solutions", "bundled", str(WRONG)]
    argv += ["--env_store_path", str(store_path), "--env_workers", "2"]
    assert main(argv) == 0
    return out


def sweep_config(out: Path, **overrides) -> EvalSweepConfig:
    values = dict(
        output_dir=str(out),
        client="fixed",
        fixed_solutions=[str(SOLUTIONS_DIR / "triton"), str(WRONG)],
        task_regex=TASK_REGEX,
        env_device="cpu",
        pass_k=[1, 2],
    )
    values.update(overrides)
    return EvalSweepConfig(**values)


def run(config: EvalSweepConfig, pool):
    tasks = load_tasks(config)
    client = FixedSolutions(config.fixed_solutions, [t.id for t in tasks])
    return Sweep(config, tasks, client, pool).run()


def test_every_wrong_solution_gets_its_status(fixed_run: Path) -> None:
    records = read_records(fixed_run / "samples.jsonl")
    assert len(records) == 10
    for record in records:
        origin = Path(record.extra["origin"])
        if origin.parent.parent == WRONG:
            assert origin.parent.name == record.task_id
            expected = origin.name.split("__")[0]
            assert record.sample == 1 and str(record.result.status) == expected, origin.name
        else:
            assert origin.parent == SOLUTIONS_DIR / "triton"
            assert record.sample == 0 and record.result.status is Status.CORRECT, (
                record.result.error
            )


def test_metrics_match_the_hand_count(fixed_run: Path) -> None:
    summary = json.loads((fixed_run / "summary.json").read_text())
    overall = summary["views"]["last"]["overall"]
    counts = {
        key: overall[key]["count"]
        for key in ("parse_rate", "compile_rate", "correct_rate", "integrity_rate")
    }
    assert counts == {"parse_rate": 9, "compile_rate": 7, "correct_rate": 5, "integrity_rate": 1}
    assert overall["attempts"] == 10 and overall["tasks"] == 5
    assert overall["pass_at_k"]["1"]["value"] == pytest.approx(0.5)
    assert overall["pass_at_k"]["2"]["value"] == pytest.approx(1.0)
    assert overall["fast_p"]["eager"]["0"]["count"] == 5
    assert overall["fast_p"]["eager"]["1"]["value"] is None  # CPU: no meaningful timings
    assert overall["geomean_speedup"]["eager"]["value"] is None
    assert overall["correct_rate"]["low"] == pytest.approx(0.236593, abs=1e-5)
    assert overall["status_counts"] == {
        "compile_error": 1,
        "correct": 5,
        "format_error": 1,
        "incorrect": 1,
        "integrity_violation": 1,
        "runtime_error": 1,
    }
    # per category: elementwise (relu, gelu) 2/4 correct; the others 1/2 each
    categories = summary["views"]["last"]["categories"]
    assert {k: (v["correct_rate"]["count"], v["attempts"]) for k, v in categories.items()} == {
        "elementwise": (2, 4),
        "matmul": (1, 2),
        "reduction": (1, 2),
        "softmax": (1, 2),
    }
    report = (fixed_run / "report.md").read_text()
    assert "| correct | 50.0% [23.7%, 76.3%] (5/10) |" in report
    # every task passes at k=2: Wilson over 5 of 5 tasks, not a bootstrap's [100%, 100%]
    assert "| pass@2 | 100.0% [56.6%, 100.0%] (5 tasks) |" in report
    assert "Timings are not meaningful" in report
    # CPU, one turn: only the per-category bars mean something; the others are named, not drawn
    assert (fixed_run / "plots" / "levels.png").stat().st_size > 1000
    for plot in ("speedup_distribution", "fast_p", "turns"):
        assert not (fixed_run / "plots" / f"{plot}.png").exists()
        assert f"`plots/{plot}.png` not drawn" in report


def test_resume_skips_what_is_done(fixed_run: Path, pool, tmp_path: Path) -> None:
    folder = tmp_path / "resumed"
    folder.mkdir()
    shutil.copy(fixed_run / "config.json", folder / "config.json")
    lines = (fixed_run / "samples.jsonl").read_text().splitlines(keepends=True)
    # a run killed after 7 results, in the middle of writing the 8th
    (folder / "samples.jsonl").write_text("".join(lines[:7]) + lines[7][:50])
    # the same settings as the recipe run (config.json records "bundled" as the CLI got it)
    config = sweep_config(folder, fixed_solutions=["bundled", str(WRONG)], env_workers=2)
    config.env_timeout_s, config.env_store_path = (
        300,
        "other.sqlite",
    )  # not part of a sample's identity
    tasks = load_tasks(config)
    client = FixedSolutions([str(SOLUTIONS_DIR / "triton"), str(WRONG)], [t.id for t in tasks])
    outcome = Sweep(config, tasks, client, pool).run()
    assert outcome.new_records == 3
    before = {r.key: str(r.result.status) for r in read_records(fixed_run / "samples.jsonl")}
    after = {r.key: str(r.result.status) for r in read_records(folder / "samples.jsonl")}
    assert after == before
    # the same folder with a setting that changes what a sample is: refused
    config.temperature = 0.7
    with pytest.raises(ValueError, match="different temperature"):
        Sweep(config, tasks, client, pool).run()
    config.overwrite = True  # ... unless asked to start over
    assert Sweep(config, tasks, client, pool).run().new_records == 10


def multi_turn_source(path: Path) -> Path:
    """01_relu refined over two turns: sample 0 goes wrong -> right, sample 1 right -> prose."""
    right = (SOLUTIONS_DIR / "triton" / "01_relu.py").read_text()
    wrong = (WRONG / "01_relu" / "incorrect__leaky_slope.py").read_text()
    prose = (WRONG / "14_softmax_rows" / "format_error__prose_only.md").read_text()
    rows = [
        {"task_id": "01_relu", "sample": 0, "turn": 0, "completion": wrong},
        {"task_id": "01_relu", "sample": 0, "turn": 1, "completion": right},
        {"task_id": "01_relu", "sample": 1, "turn": 0, "completion": right},
        {"task_id": "01_relu", "sample": 1, "turn": 1, "completion": prose},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_multi_turn_last_and_best(tmp_path: Path, pool) -> None:
    source = multi_turn_source(tmp_path / "turns.jsonl")
    config = sweep_config(
        tmp_path / "run", fixed_solutions=[str(source)], max_turns=2, task_regex="^01_relu$"
    )
    outcome = run(config, pool)
    assert sorted(r.key for r in outcome.records) == [
        ("01_relu", 0, 0),
        ("01_relu", 0, 1),
        ("01_relu", 1, 0),
        ("01_relu", 1, 1),
    ]
    summary = write_report(outcome.folder)
    # last turn: sample 0 correct, sample 1 format_error -> 1/2; best turn: both correct -> 2/2
    assert summary["views"]["last"]["overall"]["correct_rate"]["count"] == 1
    assert summary["views"]["best"]["overall"]["correct_rate"]["count"] == 2
    # turn 1: one correct (sample 1); turn 2: one correct (sample 0); best so far 1/2 then 2/2
    curve = summary["turns"]
    assert [p["correct_at_turn"]["count"] for p in curve] == [1, 1]
    assert [p["best_so_far"]["correct_rate"]["count"] for p in curve] == [1, 2]
    report = (outcome.folder / "report.md").read_text()
    assert "| metric | last turn | best turn |" in report and "## Turn by turn" in report
    # stop refining a sample once it is correct: sample 1 gets no second turn
    stop = sweep_config(
        tmp_path / "stop",
        fixed_solutions=[str(source)],
        max_turns=2,
        task_regex="^01_relu$",
        stop_when_correct=True,
    )
    keys = sorted(r.key for r in run(stop, pool).records)
    assert keys == [("01_relu", 0, 0), ("01_relu", 0, 1), ("01_relu", 1, 0)]


def test_one_shot_triton_example_is_correct(pool) -> None:
    task = task_from_source(EXAMPLE_REFERENCE, "one_shot_add")
    result = pool.submit([task], [EXAMPLE_SOLUTIONS["triton"]])[0].result()
    assert result.status is Status.CORRECT, result.error


def test_compare_two_runs(
    fixed_run: Path, pool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    only_right = sweep_config(
        tmp_path / "only_right", fixed_solutions=[str(SOLUTIONS_DIR / "triton")]
    )
    run(only_right, pool)  # every completion is in the store already
    out = tmp_path / "compare.md"
    assert (
        main(
            ["eval", "compare", str(fixed_run), str(tmp_path / "only_right"), "--output", str(out)]
        )
        == 0
    )
    text = out.read_text()
    # A: 5/10 correct, pass@1 0.5; B: 5/5 correct, pass@1 1.0
    assert "| correct | 50.0% | 100.0% | +50.0 pt |" in text
    assert "| pass@1 | 50.0% | 100.0% | +50.0 pt |" in text
    assert "| parse rate | 90.0% | 100.0% | +10.0 pt |" in text
    assert "Tasks in both runs: 5." in text
    assert "correct" in capsys.readouterr().out


def test_report_can_be_rebuilt(fixed_run: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(fixed_run, copy)
    (copy / "report.md").unlink()
    assert main(["eval", "report", str(copy), "--no-plots"]) == 0
    first = sweep_summary(read_records(copy / "samples.jsonl"), StatsConfig(pass_ks=(1, 2)))
    rebuilt = json.loads((copy / "summary.json").read_text())
    assert (
        rebuilt["views"]["last"]["overall"]["correct_rate"]
        == first["views"]["last"]["overall"]["correct_rate"]
    )
    assert "## Per category" in (copy / "report.md").read_text()


@pytest.mark.slow
def test_sweep_through_a_ray_pool(tmp_path: Path) -> None:
    """``--env_pool ray``: the same sweep on Ray actors (a local Ray with a logical GPU here), in a
    fresh process as a user runs it; training and curation build their pools the same way."""
    pytest.importorskip("ray")
    recipe = Path(__file__).resolve().parents[2] / "recipes" / "eval" / "fixed_bundled.yaml"
    out = tmp_path / "ray_sweep"
    argv = ["eval", "--config", str(recipe), "--task_regex", "^(01_relu|14_softmax_rows)$"]
    argv += [
        "--env_device",
        "cpu",
        "--env_pool",
        "ray",
        "--env_workers",
        "1",
        "--output_dir",
        str(out),
    ]
    argv += ["--fixed_solutions", "bundled", str(WRONG), "--plots", "false"]
    done = subprocess.run(
        [sys.executable, "-m", "kernelrl.launch.cli", *argv],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    statuses = {(r.task_id, r.sample): r.result.status for r in read_records(out / "samples.jsonl")}
    assert statuses == {
        ("01_relu", 0): Status.CORRECT,
        ("01_relu", 1): Status.INCORRECT,
        ("14_softmax_rows", 0): Status.CORRECT,
        ("14_softmax_rows", 1): Status.FORMAT_ERROR,
    }


# ------------------------------------------------- KernelBench-style ids: trailing "_" and "__"
def kernelbench_like(root: Path) -> Path:
    """A KernelBench layout whose ids end in "_" or hold "__", from bundled tasks without their
    declared category (KernelBench problems have none)."""
    level1 = root / "KernelBench" / "level1"
    level1.mkdir(parents=True)
    for source, name in (("01_relu", "1_ReLU_"), ("06_row_sum", "2_Row__sum"), ("01_relu", "3_X")):
        text = (TASKS_DIR / f"{source}.py").read_text()
        (level1 / f"{name}.py").write_text(re.sub(r'\n\s*"category": "[a-z]+",', "", text))
    return root


def test_kernelbench_ids_with_underscores_are_evaluated(tmp_path: Path, pool) -> None:
    root = kernelbench_like(tmp_path / "kb")
    solutions = tmp_path / "solutions"
    relu = (SOLUTIONS_DIR / "triton" / "01_relu.py").read_text()
    row_sum = (SOLUTIONS_DIR / "triton" / "06_row_sum.py").read_text()
    # the folder layout for the id with "__", the older flat layout for the trailing "_"
    (solutions / "level1" / "2_Row__sum").mkdir(parents=True)
    (solutions / "level1" / "2_Row__sum" / "bundled.py").write_text(row_sum)
    (solutions / "level1" / "1_ReLU___bundled.py").write_text(relu)
    config = sweep_config(
        tmp_path / "run",
        benchmark="kernelbench",
        benchmark_path=str(root),
        fixed_solutions=[str(solutions)],
        task_regex="",
        pass_k=[1],
    )
    tasks = load_tasks(config)
    assert {t.id: t.category for t in tasks} == {
        "level1/1_ReLU_": "elementwise",  # derived from the operators, not "uncategorized"
        "level1/2_Row__sum": "reduction",
        "level1/3_X": "elementwise",
    }
    outcome = run(config, pool)
    assert {r.task_id: r.result.status for r in outcome.records} == {
        "level1/1_ReLU_": Status.CORRECT,
        "level1/2_Row__sum": Status.CORRECT,
    }
    summary = write_report(outcome.folder, plots=False)
    overall = summary["views"]["last"]["overall"]
    # 3_X has no solution: it is failed and listed, never dropped -> 2/3 correct
    assert (overall["correct_rate"]["count"], overall["correct_rate"]["n"]) == (2, 3)
    assert overall["pass_at_k"]["1"]["value"] == pytest.approx(2 / 3)
    assert [(t["task_id"], t["reason"]) for t in overall["not_evaluated"]] == [
        ("level1/3_X", "no solution")
    ]
    assert sorted(summary["views"]["last"]["categories"]) == ["elementwise", "reduction"]
    records = read_records(outcome.folder / "samples.jsonl")
    assert {r.task_id: r.category for r in records}["level1/2_Row__sum"] == "reduction"
    report = (outcome.folder / "report.md").read_text()
    assert "| level1/3_X | 1 | no solution |" in report


def test_a_name_two_task_ids_fit_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a___x.py").write_text("A")  # task "a" label "_x", or task "a_" label "x"
    with pytest.raises(ValueError, match=r"a___x.py fits tasks a and a_; move it to <task id>/"):
        FixedSolutions([tmp_path], ["a", "a_"])
    fixed = FixedSolutions([tmp_path], ["a_"])  # one id fits: read
    assert fixed.samples_for("a_") == 1
    (tmp_path / "a___x.py").unlink()
    (tmp_path / "a_").mkdir()
    (tmp_path / "a_" / "x.py").write_text("B")  # the folder layout never clashes
    fixed = FixedSolutions([tmp_path], ["a", "a_"])
    assert (fixed.samples_for("a"), fixed.samples_for("a_")) == (0, 1)


class FailingFor:
    """The real pool, except that evaluations of one task fail (the pool's own failure, e.g. a
    lost worker): what the sweep must report as 'not evaluated', never drop."""

    def __init__(self, inner, task_id: str) -> None:
        self.inner, self.task_id = inner, task_id

    def submit(self, tasks, solutions):
        futures = []
        for task, solution in zip(tasks, solutions, strict=True):
            if task.id == self.task_id:
                failed: Future = Future()
                failed.set_exception(RuntimeError("worker lost"))
                futures.append(failed)
            else:
                futures.extend(self.inner.submit([task], [solution]))
        return futures


def test_an_unevaluable_task_counts_in_the_denominator(tmp_path: Path, pool) -> None:
    config = sweep_config(
        tmp_path / "run",
        fixed_solutions=[str(SOLUTIONS_DIR / "triton")],
        task_regex="^(01_relu|02_gelu_tanh)$",
        pass_k=[1],
    )
    tasks = load_tasks(config)
    client = FixedSolutions(config.fixed_solutions, [t.id for t in tasks])
    outcome = Sweep(config, tasks, client, FailingFor(pool, "02_gelu_tanh")).run()
    assert [r.task_id for r in outcome.records] == ["01_relu"] and len(outcome.failures) == 1
    summary = write_report(outcome.folder, plots=False)
    overall = summary["views"]["last"]["overall"]
    # one good task and one unevaluable one: 50%, not 100%
    assert overall["pass_at_k"]["1"]["value"] == pytest.approx(0.5)
    assert (overall["correct_rate"]["count"], overall["correct_rate"]["n"]) == (1, 2)
    assert overall["not_evaluated"][0]["task_id"] == "02_gelu_tanh"
    assert overall["not_evaluated"][0]["reason"] == "not evaluated: RuntimeError: worker lost"
    # resuming with a working pool evaluates it; the reason goes away
    outcome = Sweep(config, tasks, client, pool).run()
    assert outcome.new_records == 1
    summary = write_report(outcome.folder, plots=False)
    assert summary["views"]["last"]["overall"]["pass_at_k"]["1"]["value"] == pytest.approx(1.0)
    assert summary["selection"]["not_evaluated"] == []
