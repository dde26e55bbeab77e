"""Pool sizing from the host and the cluster model of an RL step: pure arithmetic."""

from __future__ import annotations

import ast
import importlib.util
import statistics
import sys
from pathlib import Path

import pytest

from kernelrl.env.pools.sizing import GIB, HostResources, size_gpu_pool

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_pool_is_sized_by_cores_and_capped_by_memory() -> None:
    h100_host = HostResources(cores=16, host_memory_bytes=128 * GIB, gpu_memory_bytes=80 * GIB)
    assert (size_gpu_pool(h100_host).per_gpu, size_gpu_pool(h100_host).spares) == (16, 8)
    explicit = size_gpu_pool(h100_host, per_gpu=4)  # an explicit choice is kept
    assert (explicit.per_gpu, explicit.spares) == (4, 4)  # spares for the slots, not the cores
    assert size_gpu_pool(h100_host, per_gpu=12).spares == 6
    one_gpu_32_cores = HostResources(cores=32, host_memory_bytes=256 * GIB)
    assert (size_gpu_pool(one_gpu_32_cores).per_gpu, size_gpu_pool(one_gpu_32_cores).spares) == (
        16,
        8,
    )
    small = HostResources(cores=64, host_memory_bytes=32 * GIB, gpu_memory_bytes=80 * GIB)
    capped = size_gpu_pool(small)  # 8 children fit: the spares give way first, to 4
    assert (capped.per_gpu, capped.spares) == (4, 4) and "capped" in capped.why
    small_gpu = HostResources(cores=32, host_memory_bytes=512 * GIB, gpu_memory_bytes=40 * GIB)
    assert (size_gpu_pool(small_gpu).per_gpu, size_gpu_pool(small_gpu).spares) == (10, 4)
    eight_gpus = HostResources(cores=128, host_memory_bytes=1024 * GIB, gpus=8)
    assert size_gpu_pool(eight_gpus).per_gpu == 16  # 16 cores per GPU
    four_cores = HostResources(cores=4, host_memory_bytes=64 * GIB)
    assert (size_gpu_pool(four_cores).per_gpu, size_gpu_pool(four_cores).spares) == (4, 4)


def test_new_kernels_are_distinct_texts_of_the_same_kernel() -> None:
    bench = _load("env_throughput")
    source = (ROOT / "data" / "solutions" / "triton" / "11_rmsnorm.py").read_text()
    a, b = bench.distinct_source(source, "rollout 0"), bench.distinct_source(source, "rollout 1")
    assert a != b != source
    assert ast.dump(ast.parse(a)) == ast.dump(ast.parse(source))  # only comments differ
    assert "    # rollout 0\n    row = tl.program_id(0)" in a  # inside the jitted function


def test_cluster_model_bounds_and_recommends() -> None:
    sizing = _load("cluster_sizing")
    recipe = sizing.Recipe.load(str(ROOT / "recipes/qwen3-14b/trloo/drkernel_14b.yaml"), 16)
    assert (recipe.trajectories, recipe.turns) == (256, 3)
    steps = []
    for m in (1, 4, 16, 64):
        cluster = sizing.Cluster(train_gpus=16, gen_gpus=8, env_gpus=m)
        steps.append(sizing.predict(recipe, cluster, 4096, train_step_s=60.0))
    assert steps[0]["bound"] == "environment" and steps[-1]["bound"] != "environment"
    assert all(a["step_s"] >= b["step_s"] for a, b in zip(steps, steps[1:], strict=False))
    best = sizing.recommend_env_gpus(recipe, sizing.Cluster(16, 8, 1), 4096)
    at_best = sizing.predict(recipe, sizing.Cluster(16, 8, best), 4096, 60.0)
    below = sizing.predict(recipe, sizing.Cluster(16, 8, best - 1), 4096, 60.0)
    assert at_best["environment_s"] <= at_best["generation_s"] < below["environment_s"]


def _pool_run(folder: Path, name: str, gpus: int, finish_times: list[float]) -> str:
    """An ``env_throughput.py`` summary and its results, each evaluation taking 2 s."""
    import gzip
    import json

    results = [{"timestamp": t - 2.0, "phase_seconds": {"total": 2.0}} for t in finish_times]
    with gzip.open(folder / f"{name}.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in results)
    wall = max(finish_times) - min(finish_times) + 2.0
    summary = {"gpus": gpus, "warm": {"evaluations": len(results), "wall_s": wall}}
    (folder / f"{name}.json").write_text(json.dumps(summary))
    return str(folder / f"{name}.json")


def test_pool_validation_measures_the_per_gpu_efficiency_of_a_host(tmp_path: Path) -> None:
    sizing = _load("cluster_sizing")
    one = _pool_run(tmp_path, "one", 1, [float(t) for t in range(1, 101)])  # 1/s
    many = _pool_run(tmp_path, "many", 2, [t * 0.625 for t in range(1, 101)])  # 1.6/s
    check = sizing.validate_pool(one, many)
    assert check["predicted_steady_evals_per_min"] == pytest.approx(120.0)
    assert check["measured_steady_evals_per_min"] == pytest.approx(96.0)
    assert check["per_gpu_efficiency"] == pytest.approx(0.8)
    single = sizing.Cluster(train_gpus=1, gen_gpus=1, env_gpus=1, multi_gpu_efficiency=0.8)
    double = sizing.Cluster(train_gpus=1, gen_gpus=1, env_gpus=2, multi_gpu_efficiency=0.8)
    assert sizing.env_evals_per_s(double) == pytest.approx(1.6 * sizing.env_evals_per_s(single))


def test_a_run_without_its_records_is_refused_in_one_line(tmp_path: Path) -> None:
    sizing = _load("cluster_sizing")
    one = _pool_run(tmp_path, "one", 1, [float(t) for t in range(1, 101)])
    summary_only = tmp_path / "summary_only.json"
    summary_only.write_text(Path(one).read_text())
    with pytest.raises(SystemExit) as refused:
        sizing.validate_pool(one, str(summary_only))
    said = str(refused.value)
    assert "summary_only.jsonl.gz" in said and "--json-out" in said and "\n" not in said


def test_a_recorded_runs_rate_is_its_slots_over_its_mean_latency() -> None:
    """Little's law on a pool run kept in the repository: with the slots always busy, the rate
    is slots over the mean latency, and the pauses are about one window of every other slot."""
    sizing = _load("cluster_sizing")
    run = ROOT / "benchmarks/results/throughput_h200/input_sets/adaptive_3.json"
    parts = sizing.rate_decomposition(str(run))
    assert parts["slots"] == 8 and parts["evaluations"] == 155
    assert parts["slots_over_mean_latency_per_min"] == pytest.approx(
        parts["measured_evals_per_min"], rel=0.05
    )
    assert parts["own_work_s"] + parts["paused_for_others_s"] == pytest.approx(
        parts["mean_latency_s"]
    )
    assert 0.8 < parts["paused_in_windows_of_the_others"] < 1.0
    assert parts["admission_wait_s"] < 0.1  # 8 slots: each admitted as it starts


def test_slots_beyond_what_the_admission_fits_queue_there() -> None:
    """The runs of a slot per core on an H100 kept in the repository: 16 slots, of whose memory
    plans about 9.5 fit the admission, so a second and more of each latency is that queue."""
    sizing = _load("cluster_sizing")
    folder = ROOT / "benchmarks/results/throughput_h100/slots"
    sized = sizing.rate_decomposition(str(folder / "b_sized_1.json"))
    before = sizing.rate_decomposition(str(folder / "b_before_1.json"))
    assert (sized["slots"], before["slots"]) == (16, 8)
    assert sized["admission_wait_s"] > 1.0 > 0.1 > before["admission_wait_s"]
    assert sized["measured_evals_per_min"] > before["measured_evals_per_min"]


NEW_OLD = ("new_1", "old_1", "old_2", "new_2")  # in the order they ran


def test_a_context_counted_once_moves_the_wait_from_the_admission_to_the_children() -> None:
    """The kept runs of the admission that counts a sandbox's context once (``new_*``) against
    the one that counted it twice (``old_*``), alternated on one H100 at 16 slots: the
    admission's wait halves, the wait for a ready child doubles, the rate stays."""
    sizing = _load("cluster_sizing")
    folder = ROOT / "benchmarks/results/throughput_h100/contexts"
    runs = {n: sizing.rate_decomposition(str(folder / f"{n}.json")) for n in NEW_OLD}
    new = [runs[n] for n in NEW_OLD if n.startswith("new")]
    old = [runs[n] for n in NEW_OLD if n.startswith("old")]
    assert max(r["admission_wait_s"] for r in new) < 0.6 * min(r["admission_wait_s"] for r in old)
    assert min(r["child_wait_s"] for r in new) > 1.5 * max(r["child_wait_s"] for r in old)
    rates = [statistics.mean(r["measured_evals_per_min"] for r in side) for side in (new, old)]
    assert rates[0] == pytest.approx(rates[1], rel=0.05)
