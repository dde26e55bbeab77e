"""The learning benchmark's records: every judged answer in ``answers.jsonl.gz`` beside its
summary, every figure recomputed from those answers alone, and runs of separate seeds pooled.

The answers come from a real evaluation on CPU: three synthetic tasks (CPU sizes), each answered
at two stages of two seeds' runs by its verified-style reference (correct by construction), a
kernel written from another graph (incorrect) or prose (a format error), replayed through the
benchmark's own held-out stage (``kernelrl eval --client fixed``, the Triton interpreter), plus
the KernelBench-set stages on one bundled task. Expected figures follow from that design; the
environment's verdicts are checked against it first.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import shutil
import sys
from pathlib import Path

import pytest

from kernelrl.data.bundled import SOLUTIONS_DIR, TASKS_DIR
from kernelrl.data.synth.config import synth_config
from kernelrl.data.synth.generate import generate_tasks
from kernelrl.data.synth.graph import Op
from kernelrl.data.synth.references import completion_for

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import learning  # noqa: E402
import learning_recompute  # noqa: E402
from learning_answers import ANSWERS_FILE, read_answers  # noqa: E402
from learning_report import two_way_bootstrap  # noqa: E402
from learning_tasks import write_task_folder  # noqa: E402

pytestmark = pytest.mark.slow

PROSE = "I would fuse these operators into one kernel and store the result once."
# seed -> stage -> per task (t0, t1, t2) the two answers given: R(ight), W(rong), P(rose)
DESIGN = {
    1: {"eval_sft": ["WR", "PW", "RW"], "eval_rl": ["RR", "WR", "RW"]},
    2: {"eval_sft": ["WW", "RW", "RR"], "eval_rl": ["RW", "RR", "RP"]},
}
# the base model's run (seed 0, the protocol's "before SFT"): its held-out sweep alone
BASE_DESIGN = {0: {"eval_base": ["PP", "PW", "RP"]}}
STATUS = {"R": "correct", "W": "incorrect", "P": "format_error"}


def _mean_gain(seed: int) -> float:
    def rate(answers: str) -> float:
        return answers.count("R") / len(answers)

    design = DESIGN[seed]
    pairs = zip(design["eval_sft"], design["eval_rl"], strict=True)
    return sum(rate(rl) - rate(sft) for sft, rl in pairs) / 3


def _tasks(tmp: Path) -> list[dict]:
    config = synth_config(
        output_dir=str(tmp),
        num_tasks=12,
        seed=3,
        size_profile="cpu",
        families=["elementwise", "reduction", "softmax"],
        dtypes=["float32"],
        dtype_weights=[1.0],
        max_pointwise=2,
    )
    rows, _ = generate_tasks(config)
    by_family: dict[str, dict] = {}
    for row in rows:
        by_family.setdefault(row["graph"].family, row)
    return [by_family[f] for f in ("elementwise", "reduction", "softmax")]


def _answers(row: dict) -> dict[str, str]:
    graph = row["graph"]
    wrong = dataclasses.replace(graph, epilogue=graph.epilogue + (Op("mul_scalar", 2.0),))
    return {"R": completion_for(graph), "W": completion_for(wrong), "P": PROSE}


def _kernelbench(tmp: Path) -> tuple[Path, Path]:
    """A KernelBench-layout folder holding one bundled task, and a one-line set naming it."""
    level1 = tmp / "kb" / "level1"
    level1.mkdir(parents=True)
    shutil.copy(TASKS_DIR / "01_relu.py", level1 / "19_ReLU.py")
    listing = tmp / "kb_set.txt"
    listing.write_text("19_ReLU.py long_row  # a bundled ReLU under a level-1 name\n")
    return tmp / "kb", listing


def _run(tmp: Path, tasks: list[dict], seed: int, store: Path, kb: tuple[Path, Path]) -> Path:
    """One seed's run folder: held-out sweeps of SFT and RL (of the base model for seed 0)
    replayed, reported."""
    design = {**DESIGN, **BASE_DESIGN}[seed]
    out = tmp / f"seed{seed}"
    import datasets

    parquet = out / "synth" / "tasks" / "heldout" / "data.parquet"
    parquet.parent.mkdir(parents=True)
    columns = [
        {"id": r["id"], "family": r["graph"].family, "graph": json.dumps(r["graph"].to_dict())}
        for r in tasks
    ]
    datasets.Dataset.from_list(columns).to_parquet(str(parquet))
    write_task_folder(tasks, out / "tasks" / "heldout")
    stages = {"synth": {"heldout_tasks": sorted(r["id"] for r in tasks), "validation_tasks": []}}
    (out / "stages.json").write_text(json.dumps(stages))
    generated = out / "generated"
    generated.mkdir()
    for stage, answered in design.items():
        lines = []
        for row, answers in zip(tasks, answered, strict=True):
            texts = _answers(row)
            for sample, letter in enumerate(answers):
                lines.append({"task_id": row["id"], "sample": sample, "completion": texts[letter]})
        (generated / f"{stage}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    extra: list[str] = []
    relu = f"```python\n{(SOLUTIONS_DIR / 'triton' / '01_relu.py').read_text()}```\n"
    # the KernelBench set's stages: seed 1's SFT answers wrong, RL right; the base model wrong
    kb_stages = {1: (("kb_sft", PROSE), ("kb_rl", relu)), 0: (("kb_base", PROSE),)}
    if seed in kb_stages:
        for stage, text in kb_stages[seed]:
            folder = generated / stage
            folder.mkdir()
            rows = [{"task_id": "level1_19_ReLU", "sample": s, "completion": text} for s in (0, 1)]
            (folder / "completions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        extra = ["--kernelbench", str(kb[0]), "--kernelbench-set", str(kb[1])]
    argv = ["--out", str(out), "--results", str(out / "results"), "--samples", "2"]
    argv += ["--run-seed", str(seed), "--replay", "--resamples", "300", *extra]
    argv += ["--eval-set", f"env_store_path={store}", "env_workers=2"]
    bench = learning.Benchmark(learning.build_parser().parse_args(argv))
    bench.synth()
    for stage in design:
        bench.evaluate(stage, "smollm2-135m-instruct")
    bench.judge_kb()
    bench.report()
    return out


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[int, Path], list[str]]:
    """(seed -> run folder, the task ids in the design's order); seed 0 is the base model's."""
    tmp = tmp_path_factory.mktemp("learning")
    tasks = _tasks(tmp / "synth")
    kb = _kernelbench(tmp)
    store = tmp / "store.sqlite"
    seeds = [*DESIGN, *BASE_DESIGN]
    return {seed: _run(tmp, tasks, seed, store, kb) for seed in seeds}, [r["id"] for r in tasks]


@pytest.fixture(scope="module")
def runs(made: tuple[dict[int, Path], list[str]]) -> dict[int, Path]:
    """The runs of SFT and RL, by seed."""
    return {seed: folder for seed, folder in made[0].items() if seed in DESIGN}


def test_every_judged_answer_is_recorded_with_its_stage_seed_and_split(made) -> None:
    runs, tasks = made
    rows = read_answers(runs[1] / ANSWERS_FILE)
    heldout = [r for r in rows if r["split"] == "heldout"]
    assert len(heldout) == 3 * 2 * 2 and {r["seed"] for r in rows} == {1}
    assert {r["stage"] for r in heldout} == {"sft", "rl"}
    for row in heldout:  # the environment judged each answer as designed
        stage = "eval_sft" if row["stage"] == "sft" else "eval_rl"
        letter = DESIGN[1][stage][tasks.index(row["task_id"])][row["sample"]]
        assert row["status"] == STATUS[letter] and row["correct"] == (letter == "R")
    assert {r["operator"] for r in heldout} >= {"elementwise"}
    kb = [r for r in rows if r["split"] == "kernelbench_level1"]
    assert [(r["stage"], r["status"]) for r in kb] == [("sft", "format_error")] * 2 + [
        ("rl", "correct")
    ] * 2
    assert (runs[1] / "results" / ANSWERS_FILE).read_bytes() == (
        runs[1] / ANSWERS_FILE
    ).read_bytes()


def test_every_figure_is_recomputed_from_the_answers_alone(runs, capsys) -> None:
    for seed, folder in runs.items():
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["pooled"]["seeds"] == [seed]
        assert summary["pooled"]["gain"] == pytest.approx(_mean_gain(seed))
        assert summary["stages"]["rl"]["correct"]["value"] == pytest.approx(summary["pooled"]["rl"])
        assert learning_recompute.main([str(folder), "--check"]) == 0
    assert "every figure recomputed" in capsys.readouterr().out
    kb = json.loads((runs[1] / "summary.json").read_text())["kernelbench"]["1"]
    assert kb["stages"]["rl"]["correct"]["value"] == 1.0
    families = (runs[1] / "families.md").read_text()
    assert "| all | 3 | 6 |" in families


def test_runs_of_separate_seeds_are_pooled(runs, tmp_path) -> None:
    out = tmp_path / "pooled"
    assert learning_recompute.main([str(runs[1]), str(runs[2]), "--out", str(out)]) == 0
    pooled = json.loads((out / "summary.json").read_text())
    assert pooled["pooled"]["seeds"] == [1, 2]
    assert pooled["pooled"]["gain"] == pytest.approx((_mean_gain(1) + _mean_gain(2)) / 2)
    low, high = pooled["pooled"]["ci_low"], pooled["pooled"]["ci_high"]
    assert low < pooled["pooled"]["gain"] < high
    for seed, folder in runs.items():
        own = json.loads((folder / "summary.json").read_text())
        assert pooled["per_seed"][str(seed)]["differences"] == own["differences"]
        assert pooled["pooled"]["per_seed"][str(seed)] == own["pooled"]["per_seed"][str(seed)]
    assert len(read_answers(out / ANSWERS_FILE)) == sum(
        len(read_answers(f / ANSWERS_FILE)) for f in runs.values()
    )
    assert "pooled (2 seeds)" in (out / "table.md").read_text()
    with pytest.raises(SystemExit, match="seed 1 is in"):
        learning_recompute.main([str(runs[1]), str(runs[1] / "results"), "--out", str(out)])


def test_the_base_models_run_is_pooled_as_before_sft(made, runs, tmp_path) -> None:
    """The protocol's last window answers with the base model alone (seed 0): its answers are
    recorded as "before SFT", its own figures recompute, and pooled with the runs it adds a
    stage to the tables without entering the RL - SFT gain, which is the runs' alone."""
    folders, tasks = made
    base = folders[0]
    rows = read_answers(base / ANSWERS_FILE)
    assert {(r["seed"], r["stage"]) for r in rows} == {(0, "base")}
    for row in (r for r in rows if r["split"] == "heldout"):
        letter = BASE_DESIGN[0]["eval_base"][tasks.index(row["task_id"])][row["sample"]]
        assert row["status"] == STATUS[letter]
    assert [r["status"] for r in rows if r["split"] == "kernelbench_level1"] == ["format_error"] * 2
    assert learning_recompute.main([str(base), "--check"]) == 0
    with_base, without = tmp_path / "with_base", tmp_path / "without"
    assert (
        learning_recompute.main([str(base), str(runs[1]), str(runs[2]), "--out", str(with_base)])
        == 0
    )
    assert learning_recompute.main([str(runs[1]), str(runs[2]), "--out", str(without)]) == 0
    pooled = json.loads((with_base / "summary.json").read_text())
    assert pooled["pooled"] == json.loads((without / "summary.json").read_text())["pooled"]
    assert pooled["pooled"]["seeds"] == [1, 2]
    assert pooled["kernelbench"]["0"]["stages"]["base"]["correct"]["value"] == 0.0
    assert pooled["per_seed"]["0"]["stages"]["base"]["correct"]["value"] == pytest.approx(1 / 6)
    assert "before SFT" in (with_base / "table.md").read_text()
    assert learning_recompute.main([str(with_base), "--check"]) == 0


def test_a_figure_that_the_answers_do_not_give_is_found(runs, tmp_path, capsys) -> None:
    edited = tmp_path / "edited"
    shutil.copytree(runs[2], edited, ignore=shutil.ignore_patterns("results", "generated"))
    summary = json.loads((edited / "summary.json").read_text())
    summary["pooled"]["gain"] += 0.01
    (edited / "summary.json").write_text(json.dumps(summary))
    assert learning_recompute.main([str(edited), "--check"]) == 1
    assert "/pooled/gain" in capsys.readouterr().out
    # an answer changed after the report: its stage's figures no longer follow
    shutil.copy(runs[2] / "summary.json", edited / "summary.json")
    rows = read_answers(edited / ANSWERS_FILE)
    rows[0]["correct"] = 1.0 - rows[0]["correct"]
    with gzip.open(edited / ANSWERS_FILE, "wt") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in rows)
    assert learning_recompute.main([str(edited), "--check"]) == 1
    assert "/per_seed/2/stages/sft/correct/value" in capsys.readouterr().out


def test_the_pooled_interval_resamples_seeds_and_tasks() -> None:
    """Equal cells give a point interval; a seed far from the others widens the interval that a
    bootstrap over tasks alone would give; unjudged cells (NaN) count nowhere; the draws are
    fixed by the seed."""
    import numpy as np

    flat = two_way_bootstrap(np.full((3, 5), 0.25), 200, 0)
    assert (flat["gain"], flat["ci_low"], flat["ci_high"]) == (0.25, 0.25, 0.25)
    cells = np.array([[0.5, 0.5, 0.0, 0.5], [0.0, 0.0, -0.5, 0.0], [0.25, 0.25, 0.0, np.nan]])
    both = two_way_bootstrap(cells, 2000, 1)
    assert both["cells"] == 11 and both["gain"] == pytest.approx(np.nanmean(cells))
    pooled_rows = two_way_bootstrap(np.nanmean(cells, axis=0, keepdims=True), 2000, 1)
    assert both["ci_high"] - both["ci_low"] > pooled_rows["ci_high"] - pooled_rows["ci_low"]
    assert two_way_bootstrap(cells, 2000, 1) == both
    with pytest.raises(ValueError, match="no task"):
        two_way_bootstrap(np.full((2, 2), np.nan), 10, 0)
