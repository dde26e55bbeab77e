"""Synthetic tasks (kernelrl.data.synth): seeded, deduplicated, split by operator combination,
decontaminated, validated in the sandbox, and given reference solutions the environment judged
correct. Tasks are generated here, small; nothing is read from a committed dataset."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest
import torch

from kernelrl.data.curate.decontaminate import Benchmark, DecontaminateConfig, decontaminate
from kernelrl.data.curate.dedup import dedup
from kernelrl.data.curate.normalize import normalize_tasks
from kernelrl.data.curate.validate import ValidateConfig, validate_tasks
from kernelrl.data.schema import make_dataset
from kernelrl.data.synth.check import check_task
from kernelrl.data.synth.config import synth_config
from kernelrl.data.synth.generate import generate_tasks
from kernelrl.data.synth.graph import FAMILIES, POINTWISE, Graph, Op, draw, pointwise_in
from kernelrl.data.synth.pipeline import run_synthesis
from kernelrl.data.synth.references import reference_sft
from kernelrl.data.synth.render import render_task
from kernelrl.data.synth.split import check_split, split_combinations
from kernelrl.env.evaluator import EvalConfig
from kernelrl.env.pools.local import LocalPool

BENCHMARK = Path(__file__).parents[1] / "fixtures" / "curate" / "benchmark"


def _config(tmp_path: Path, **keys):
    return synth_config(output_dir=str(tmp_path), **keys)


def _dataset(rows):
    return make_dataset([{k: v for k, v in r.items() if k != "graph"} for r in rows], "tasks")


def test_same_seed_same_tasks_other_seed_other_tasks(tmp_path):
    first, _ = generate_tasks(_config(tmp_path, num_tasks=40, seed=3))
    again, _ = generate_tasks(_config(tmp_path, num_tasks=40, seed=3))
    other, _ = generate_tasks(_config(tmp_path, num_tasks=40, seed=4))
    assert [r["source"] for r in first] == [r["source"] for r in again]
    assert {r["source"] for r in first} != {r["source"] for r in other}
    assert {r["graph"].family for r in first} == set(FAMILIES)


def test_duplicates_are_skipped_when_the_space_is_small(tmp_path):
    # Single-operator float32 elementwise tasks: few enough that a seed repeats graphs.
    config = _config(
        tmp_path,
        num_tasks=600,
        families=["elementwise"],
        dtypes=["float32"],
        dtype_weights=[1.0],
        max_pointwise=1,
        rank3_share=0.0,
    )
    rows, report = generate_tasks(config)
    assert report.notes["duplicates_skipped"] > 0
    assert len({r["graph"].key("cuda") for r in rows}) == len(rows)
    # curation's computation dedup agrees: nothing left to remove, a renamed copy is removed
    copy = {
        **rows[0],
        "id": "renamed_copy",
        "source": rows[0]["source"].replace("h = x", "h = x  # same"),
    }
    kept, dedup_report = dedup(_dataset(rows + [copy]))
    assert len(kept) == len(rows)
    assert [r.id for r in dedup_report.removed] == ["renamed_copy"]


def test_split_by_combination_holds_its_promise():
    rng = random.Random(0)
    config = _config(Path("/nonexistent")).draw_config()
    combos = [draw(rng, config).combination for _ in range(3000)]
    assignment = split_combinations(combos, 0.1, 0.05, seed=0)
    splits = [assignment[c] for c in combos]
    assert check_split(combos, splits) == []
    counts = {s: splits.count(s) for s in ("train", "validation", "heldout")}
    assert 0.08 * len(combos) <= counts["heldout"] <= 0.1 * len(combos)
    assert 0.03 * len(combos) <= counts["validation"] <= 0.05 * len(combos)
    held = {c for c, s in zip(combos, splits, strict=True) if s == "heldout"}
    train = {c for c, s in zip(combos, splits, strict=True) if s == "train"}
    assert not held & train
    train_ops = {op for c in train for op in c.split(">")}
    assert all(set(c.split(">")) <= train_ops for c in held)
    # splits that break the promise are reported: the check can fail
    only = ["relu>exp", "relu>exp", "sum"]
    assert check_split(only, ["train", "heldout", "train"])  # same combination in both
    assert check_split(["relu", "sum"], ["train", "heldout"])  # sum never seen in train


def test_evaluation_splits_hold_only_chains_longer_than_the_reference_tier():
    rng = random.Random(0)
    config = _config(Path("/nonexistent"), max_pointwise=6).draw_config()
    combos = [draw(rng, config).combination for _ in range(3000)]
    assignment = split_combinations(combos, 0.1, 0.05, seed=0, min_pointwise=4)
    splits = [assignment[c] for c in combos]
    assert check_split(combos, splits, min_pointwise=4) == []
    evaluated = [c for c, s in zip(combos, splits, strict=True) if s != "train"]
    assert len(evaluated) >= 0.12 * len(combos)  # the shares are still reached
    assert min(pointwise_in(c) for c in evaluated) >= 4
    assert min(pointwise_in(c) for c in combos) < 4  # shorter chains exist, and stay in train
    # the check reports a short chain in an evaluation split
    assert check_split(["relu>sum", "relu>sum>exp"], ["train", "heldout"], min_pointwise=3)


def test_operator_that_appears_once_never_leaves_train():
    combos = ["relu>sum", "relu", "sum>exp", "relu>exp", "exp"] * 3 + ["abs>relu"]
    assignment = split_combinations(combos, 0.5, 0.2, seed=1)
    assert assignment["abs>relu"] == "train"  # abs occurs nowhere else
    assert check_split(combos, [assignment[c] for c in combos]) == []


def test_in_process_check_rejects_constant_and_misshapen_tasks(tmp_path):
    rows, _ = generate_tasks(_config(tmp_path, num_tasks=1, families=["elementwise"]))
    graph: Graph = rows[0]["graph"]
    constant = dataclasses.replace(
        graph, prologue=(Op("relu"), Op("neg"), Op("clamp", (0.0, 2.0))), dtype="float32"
    )
    assert "does not depend" in check_task(constant, render_task(constant), "cuda")
    row_bias = dataclasses.replace(graph, prologue=(Op("add_row"),), dtype="float32")
    source = render_task(row_bias)
    assert check_task(row_bias, source, "cuda") is None
    broken = source.replace("r0 = torch.randn(dim", "r0 = torch.randn(dim + 1")
    assert "RuntimeError" in check_task(row_bias, broken, "cuda")


def test_decontamination_against_the_fixture_benchmark(tmp_path):
    rows, _ = generate_tasks(_config(tmp_path, num_tasks=30, seed=5))
    copied = (BENCHMARK / "level1" / "36_channel_rms_scale.py").read_text()
    records = _dataset(rows + [{"id": "copied_from_benchmark", "source": copied}])
    benchmark = Benchmark.from_sources([f"kernelbench:{BENCHMARK}"], DecontaminateConfig())
    kept, report = decontaminate(records, benchmark)
    assert [r.id for r in report.removed] == ["copied_from_benchmark"]
    assert len(kept) == len(rows)


def test_sandbox_validation_passes_generated_tasks_and_catches_a_broken_one(tmp_path):
    rows, _ = generate_tasks(_config(tmp_path, num_tasks=2, seed=7, size_profile="cpu"))
    broken = dict(rows[0], id="broken")
    # a reference that crashes in the sandbox: its input has the wrong trailing size
    broken["source"] = broken["source"].replace("def forward(self, x", "def forward(self, x, *rest")
    broken["source"] = broken["source"].replace("h = x\n", "h = x.view(-1, 7)\n")
    tasks, _ = normalize_tasks(_dataset(rows + [broken]))
    kept, report = validate_tasks(tasks, ValidateConfig(validate_workers=2), device="cpu")
    assert sorted(kept["id"]) == sorted(r["id"] for r in rows)
    assert [r.id for r in report.removed] == ["broken"]


def test_reference_solutions_judged_correct_and_a_wrong_one_kept_out(tmp_path):
    rows, _ = generate_tasks(_config(tmp_path, num_tasks=40, seed=11))
    by_family = {}
    for row in rows:
        by_family.setdefault(row["graph"].family, row)
    picked = [by_family[f] for f in FAMILIES]
    graphs = {r["id"]: r["graph"] for r in picked}
    # One candidate written from another graph: a wrong kernel the environment must reject.
    wrong = picked[0]
    mutated = dataclasses.replace(
        wrong["graph"], prologue=wrong["graph"].prologue + (Op("mul_scalar", 2.0),)
    )
    graphs[wrong["id"]] = mutated
    tasks, _ = normalize_tasks(_dataset(picked))
    with LocalPool(EvalConfig(device="cpu"), workers=2) as pool:
        samples, sft, reports = reference_sft(tasks, graphs, pool, _config(tmp_path).sft)
    statuses = {s["task_id"]: json.loads(s["result"])["status"] for s in samples}
    assert statuses[wrong["id"]] == "incorrect"
    assert all(statuses[r["id"]] == "correct" for r in picked[1:]), statuses
    assert sorted(sft["task_id"]) == sorted(r["id"] for r in picked[1:])
    assert all(sft["correct"]) and not any(sft["checks_failed"])
    assert reports[0].notes["statuses"] == {"correct": 4, "incorrect": 1}


@pytest.mark.parametrize("validate_candidates", [True, False])
def test_pipeline_writes_splits_and_references_for_train_tasks_only(tmp_path, validate_candidates):
    config = _config(
        tmp_path,
        num_tasks=80,
        seed=2,
        sandbox_sample=1,
        reference_solutions=1,
        validate_candidates=validate_candidates,
        benchmark_sources=[f"kernelbench:{BENCHMARK}"],
    )
    result = run_synthesis(config)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["tasks"] == sum(summary["splits"].values()) == 80
    # the seeded sample always runs in the sandbox; the candidate too unless its reference
    # solution's evaluation is left to run it
    validated = summary["sandbox"]["validated"]
    assert (1 <= validated <= 2) if validate_candidates else validated == 1
    assert summary["sandbox"]["failed"] == []
    assert summary["reference_solutions"]["verified_in_sft"] == len(result.sft) == 1
    train = set(result.splits["train"]["id"])
    assert set(result.sft["task_id"]) <= train
    for name in ("train", "validation", "heldout"):
        assert (tmp_path / "tasks" / name / "data.parquet").is_file()
    all_ops = {op for d in result.splits.values() for ops in d["synth_ops"] for op in ops}
    assert all_ops <= set(POINTWISE) | {
        "sum",
        "mean",
        "amax",
        "softmax",
        "log_softmax",
        "layer_norm",
        "rms_norm",
        "l2_normalize",
        "linear",
    }
    assert all(result.splits["train"]["difficulty"])
    steps = {s["step"]: s for s in json.loads((tmp_path / "steps.json").read_text())}
    # graphs are deduplicated as problems, so curation's computation dedup finds nothing more
    assert steps["dedup"]["count_out"] == steps["dedup"]["count_in"] == 80


def test_references_cover_short_chains_and_evaluation_the_longer_ones(tmp_path):
    config = _config(
        tmp_path,
        num_tasks=80,
        seed=2,
        families=["elementwise", "reduction"],
        max_pointwise=4,
        reference_max_pointwise=2,
        sandbox_sample=1,
        reference_solutions=2,
        validate_candidates=False,
    )
    result = run_synthesis(config)
    pointwise = {
        row["id"]: Graph.from_dict(json.loads(row["graph"])).pointwise
        for split in result.splits.values()
        for row in split
    }
    assert result.sft is not None and len(result.sft) == 2
    assert all(pointwise[task] <= 2 for task in result.sft["task_id"])
    for name in ("validation", "heldout"):
        assert len(result.splits[name]) and all(
            pointwise[t] >= 3 for t in result.splits[name]["id"]
        )
    assert any(pointwise[t] >= 3 for t in result.splits["train"]["id"])  # what RL learns on
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["reference_max_pointwise"] == 2
    assert sum(summary["pointwise"]["heldout"].values()) == len(result.splits["heldout"])
    with pytest.raises(ValueError, match="reference_max_pointwise"):
        _config(tmp_path, max_pointwise=3, reference_max_pointwise=3)


RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "synth" / "synthetic_cpu.yaml"


def test_cli_recipe_help_and_one_line_errors(tmp_path, capsys):
    from kernelrl.launch.cli import main

    assert main(["synth", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--config RECIPE.yaml" in out and "--num_tasks" in out and "--decontam_ngram" in out
    words = ["synth", "--config", str(RECIPE), "--output_dir", str(tmp_path / "out")]
    assert main([*words, "--num_taks", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "num_taks (did you mean num_tasks?)" in err
    assert main([*words, "--size_profile", "tpu"]) == 2
    assert "size_profile" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_drawing_rules_keep_gpu_sized_references_finite():
    """What the in-process check cannot see (values at GPU sizes) is excluded when drawing:
    at most one growing operator, none after a sum, none before a sum in half precision, and
    exp only after the input or an operator whose output stays small."""
    from kernelrl.data.synth.graph import EXP_AFTER, GROWING

    rng = random.Random(0)
    config = _config(Path("/nonexistent")).draw_config()
    for _ in range(5000):
        graph = draw(rng, config)
        grown = [op for op in graph.ops if op.kind in GROWING]
        assert len(grown) <= 1, graph.combination
        if graph.core is not None and graph.core.kind == "sum":
            assert not any(op.kind in GROWING for op in graph.epilogue), graph.combination
            if graph.dtype != "float32":
                assert not grown, graph.combination
        kinds = [None] + [op.kind for op in graph.ops]
        for before, kind in zip(kinds, kinds[1:], strict=False):
            assert kind != "exp" or before in EXP_AFTER, graph.combination


def test_a_half_precision_sum_gets_the_tolerance_a_fused_kernel_needs(tmp_path):
    from kernelrl.data.synth.tolerance import measured_tolerances, sample_sizes
    from kernelrl.env.task import DEFAULT_TOLERANCES

    rows, _ = generate_tasks(_config(tmp_path, num_tasks=1, families=["reduction"]))
    graph: Graph = rows[0]["graph"]
    cuda = graph.sizes["cuda"]
    long_row = dataclasses.replace(cuda, dims=(("batch_size", 1024), ("dim", 8192)))
    half_sum = dataclasses.replace(
        graph,
        dtype="float16",
        prologue=(Op("mul_input"), Op("add_input")),
        core=Op("sum"),
        epilogue=(),
        sizes={**graph.sizes, "cuda": long_row},
    )
    source = render_task(half_sum)
    widened = measured_tolerances(half_sum, source)
    assert widened is not None
    # what a fused kernel returns (the chain in fp32, rounded once) fails the dtype's default
    # tolerance and passes the measured one, on inputs the measurement did not see
    namespace: dict = {}
    exec(compile(source, "<task>", "exec"), namespace)  # noqa: S102 - generated here
    namespace.update(sample_sizes(half_sum))
    torch.manual_seed(123)
    x, y0, y1 = namespace["get_inputs"]()
    eager = namespace["Model"]()(x, y0, y1)
    fused = torch.sum(x.float() * y0.float() + y1.float(), dim=-1, keepdim=True).half()
    atol, rtol = DEFAULT_TOLERANCES["float16"]
    assert not torch.allclose(fused, eager, atol=atol, rtol=rtol)
    assert torch.allclose(fused, eager, atol=widened[0], rtol=widened[1])
    # the task's source carries it, and the environment reads it from there
    assert f"'atol': {widened[0]}" in render_task(half_sum, "cuda", widened)
    # float32 chains round at fp32 either way, and short half-precision rows need nothing more
    assert measured_tolerances(dataclasses.replace(half_sum, dtype="float32"), source) is None
    short = dataclasses.replace(
        half_sum,
        sizes={
            **graph.sizes,
            "cuda": dataclasses.replace(long_row, dims=(("batch_size", 8), ("dim", 16))),
        },
    )
    assert measured_tolerances(short, render_task(short)) is None


# ------------------------------------------------------------------------------ layout families
def _layout_tasks(tmp_path: Path, num_tasks: int = 40, seed: int = 5) -> list[dict]:
    from kernelrl.data.synth.graph import LAYOUT_FAMILIES

    config = _config(
        tmp_path, num_tasks=num_tasks, seed=seed, families=list(LAYOUT_FAMILIES), max_pointwise=3
    )
    rows, _ = generate_tasks(config)
    return rows


def test_layout_families_draw_what_the_row_template_cannot_express(tmp_path):
    """Rows longer than the references' block at both sizes, cores over dimension 1, products of
    two inputs; float32; a long row is its own combination; legacy recipes never draw them."""
    from kernelrl.data.synth.graph import LAYOUT_FAMILIES, pointwise_in
    from kernelrl.data.synth.layout_ref import DIM_BLOCK_M, LONG_BLOCK

    rows = _layout_tasks(tmp_path)
    graphs = [r["graph"] for r in rows]
    assert {g.family for g in graphs} == set(LAYOUT_FAMILIES)
    assert {g.dtype for g in graphs} == {"float32"}
    for graph in graphs:
        cpu, cuda = graph.sizes["cpu"].values, graph.sizes["cuda"].values
        if graph.family == "long_row":
            assert cpu["dim"] > LONG_BLOCK and cuda["dim"] >= 32 * LONG_BLOCK
            assert graph.combination.startswith("long_row>")
            assert pointwise_in(graph.combination) == graph.pointwise
        if graph.family == "dim_reduction":
            assert cpu["dim1"] > DIM_BLOCK_M and graph.core.kind.endswith("_dim")
        if graph.family == "tiled_matmul":
            assert graph.prologue == () and set(cpu) >= {"M", "N", "K"}
    short = [g for g in graphs if g.family == "long_row"][0]
    assert short.combination != ">".join(op.kind for op in short.ops)  # not the row task's
    legacy = generate_tasks(_config(tmp_path, num_tasks=60, seed=5))[0]
    assert {r["graph"].family for r in legacy} <= set(FAMILIES)


def test_layout_references_are_judged_correct_by_the_environment(tmp_path):
    """Each family's looping, strided or tiled reference, evaluated as the synthesis evaluates
    every reference (the environment on CPU, Triton's interpreter, at the tasks' CPU sizes):
    correct; one written from another graph (max where the task asks for min) is not."""
    rows = _layout_tasks(tmp_path)
    wanted = ["softmax", "layer_norm", "sum", None, "softmax_dim", "amin_dim", "rms_norm_dim"]
    wanted += ["matmul_ta", "matmul_tb", "bmm"]
    by_core = {}
    for row in rows:
        core = row["graph"].core.kind if row["graph"].core else None
        by_core.setdefault((row["graph"].family == "long_row", core), row)
    picked = [by_core[(core in (None, "softmax", "layer_norm", "sum"), core)] for core in wanted]
    graphs = {r["id"]: r["graph"] for r in picked}
    wrong = by_core[(False, "amin_dim")]
    graphs[wrong["id"]] = dataclasses.replace(wrong["graph"], core=Op("amax_dim"))
    tasks, _ = normalize_tasks(_dataset(picked))
    with LocalPool(EvalConfig(device="cpu"), workers=2) as pool:
        samples, sft, _ = reference_sft(tasks, graphs, pool, _config(tmp_path).sft)
    statuses = {s["task_id"]: json.loads(s["result"])["status"] for s in samples}
    assert statuses.pop(wrong["id"]) == "incorrect"
    assert set(statuses.values()) == {"correct"}, statuses
    assert sorted(sft["task_id"]) == sorted(statuses)


def test_a_harness_error_in_the_sandbox_stops_the_run_instead_of_dropping_the_task():
    """A task the sandbox found broken is removed; one it could not judge (our failure) is not
    the task's fault, and dropping it would change the dataset and its splits."""
    from kernelrl.data.curate.report import StepReport
    from kernelrl.data.synth.pipeline import sandbox_failures

    report = StepReport("validate")
    report.remove("synth0_000001", "constant_output", "outputs equal for two seeds")
    assert sandbox_failures(report) == ["synth0_000001"]
    report.remove("synth0_000002", "harness_error", "HarnessFailure('expected solution')")
    with pytest.raises(RuntimeError, match="not of the tasks"):
        sandbox_failures(report)


def test_the_synthesis_runs_the_layout_families_end_to_end(tmp_path):
    """Curation reads them (contract, dedup, difficulty), the split keeps its promise with a
    long row as its own operator, and each family's reference is verified by the environment."""
    from kernelrl.data.synth.graph import LAYOUT_FAMILIES

    config = _config(
        tmp_path,
        num_tasks=60,
        seed=4,
        families=list(LAYOUT_FAMILIES),
        max_pointwise=3,
        sandbox_sample=1,
        reference_solutions=3,
        validate_candidates=False,
    )
    result = run_synthesis(config)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["tasks"] == 60 and set(summary["families"]) == set(LAYOUT_FAMILIES)
    assert summary["reference_solutions"]["statuses"] == {"correct": 3}
    rows = [row for split in result.splits.values() for row in split]
    assert check_split([r["combination"] for r in rows], [r["split"] for r in rows]) == []
    families = {r["task_id"]: r for r in result.sft}
    assert len(families) == 3
    by_id = {r["id"]: r["family"] for r in rows}
    assert {by_id[task] for task in families} == set(LAYOUT_FAMILIES)
