"""benchmarks/learning_gpu_arms.sh: RL variants side by side, one per GPU. Its per-variant work
(learning_gpu.sh) and the GPU count (nvidia-smi) are stood in for, to check what runs where: each
variant on its own GPU with its overrides, the choice on validation feeding the held-out sweep."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "learning_gpu_arms.sh"
STAND_IN = """#!/usr/bin/env bash
bench=$1 sft=$2; shift 2
echo "gpu=${CUDA_VISIBLE_DEVICES:-${SWEEP_GPUS// /,}} tag=$RL_TAG set=[$RL_SET] variants=[${RL_VARIANTS:-}] sft=$sft $*" >> "$bench/calls.txt"
stage=${2:-$1}
python3 -c 'import os, sys; os.write(1, " ".join([sys.argv[1], *map(str, sorted(os.sched_getaffinity(0)))]).encode() + b"\\n")' "${CUDA_VISIBLE_DEVICES:-}" >> "$bench/cores.txt"  # one write: variants append at once
if [ "$1" = sft ]; then echo '{"select_sft": {"chosen": "/gpu/ck-75"}}' > "$bench/stages.json"; fi
if [ "$stage" = select_variant ]; then echo '{"select_variant": {"chosen": "gpu_hot"}}' > "$bench/stages.json"; fi
if [ "$RL_TAG" = "${FAIL_TAG:-}" ] && [ "$1" = rl ]; then exit 3; fi
if [ "$stage" = eval_rl ]; then echo "start eval_rl" >> "$bench/order.txt"; fi
if [ "$stage" = eval_sft ]; then sleep 0.5; echo "end eval_sft" >> "$bench/order.txt"; fi
"""


def _run(
    tmp_path: Path, *args: str, gpus: int = 2, sft: str = "/sft", **env: str
) -> tuple[int, list[str]]:
    if shutil.which("bash") is None:
        pytest.skip("needs bash")
    scripts, bin_dir, bench = tmp_path / "b", tmp_path / "bin", tmp_path / "bench"
    for folder in (scripts, bin_dir, bench):
        folder.mkdir(exist_ok=True)
    shutil.copy(SCRIPT, scripts / SCRIPT.name)
    (scripts / "learning_gpu.sh").write_text(STAND_IN)
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + "".join(f'echo "GPU {i}: H100"\n' for i in range(gpus)))
    smi.chmod(0o755)
    status = subprocess.run(
        ["bash", str(scripts / SCRIPT.name), str(bench), sft, *args],
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", **env},
        capture_output=True,
        text=True,
    ).returncode
    calls = bench / "calls.txt"
    return status, sorted(calls.read_text().splitlines()) if calls.exists() else []


VARIANTS = ("gpu", "gpu_hot:learning_rate=6e-4,temperature=1.0")
HOT = "set=[learning_rate=6e-4 temperature=1.0]"


def test_each_variant_trains_on_its_own_gpu_with_its_overrides(tmp_path: Path) -> None:
    status, calls = _run(
        tmp_path, "rl", *VARIANTS, "--", "--stop_after_s", "60", CURRICULUM="difficulty"
    )
    assert status == 0
    assert calls == [
        "gpu=0 tag=gpu set=[] variants=[] sft=/sft rl --stop_after_s 60",
        f"gpu=1 tag=gpu_hot {HOT} variants=[] sft=/sft rl --stop_after_s 60",
    ]


@pytest.mark.parametrize("curriculum", ["beyond-references", "pass-rate"])
def test_a_curriculum_is_chosen_once_before_the_variants_train_on_it(
    tmp_path: Path, curriculum: str
) -> None:
    status, _ = _run(tmp_path, "rl", *VARIANTS, CURRICULUM=curriculum)
    assert status == 0
    calls = (tmp_path / "bench" / "calls.txt").read_text().splitlines()
    assert calls[0] == "gpu=0 tag=gpu set=[] variants=[] sft=/sft curriculum"
    assert sorted(calls[1:]) == [
        "gpu=0 tag=gpu set=[] variants=[] sft=/sft rl",
        f"gpu=1 tag=gpu_hot {HOT} variants=[] sft=/sft rl",
    ]


def test_the_variant_chosen_on_validation_is_the_one_swept_on_held_out_tasks(
    tmp_path: Path,
) -> None:
    (tmp_path / "bench" / "generated").mkdir(parents=True)
    (tmp_path / "bench" / "generated" / "eval_base.jsonl").write_text("")
    status, calls = _run(tmp_path, "evaluate", *VARIANTS)
    assert status == 0
    assert calls == [
        "gpu=0 tag=gpu set=[] variants=[] sft=/sft evaluate rl select_rl",
        "gpu=0 tag=gpu set=[] variants=[gpu gpu_hot] sft=/sft evaluate select_variant",
        f"gpu=0 tag=gpu_hot {HOT} variants=[] sft=/sft evaluate eval_base --replay",
        f"gpu=0 tag=gpu_hot {HOT} variants=[] sft=/sft evaluate eval_sft",
        f"gpu=1 tag=gpu_hot {HOT} variants=[] sft=/sft evaluate eval_rl",
        f"gpu=1 tag=gpu_hot {HOT} variants=[] sft=/sft evaluate rl select_rl",
    ]


def test_without_the_cpu_box_answers_the_base_model_is_sampled_here(tmp_path: Path) -> None:
    status, calls = _run(tmp_path, "evaluate", *VARIANTS)
    assert status == 0
    assert f"gpu=0 tag=gpu_hot {HOT} variants=[] sft=/sft evaluate eval_base" in calls
    assert not any("--replay" in call for call in calls)


def test_with_a_third_gpu_the_base_model_is_swept_beside_the_others(tmp_path: Path) -> None:
    status, calls = _run(tmp_path, "evaluate", *VARIANTS, gpus=4)
    assert status == 0
    sweeps = [call for call in calls if "eval_" in call]
    assert sweeps == [
        f"gpu=0 tag=gpu_hot {HOT} variants=[] sft=/sft evaluate eval_sft",
        f"gpu=1 tag=gpu_hot {HOT} variants=[] sft=/sft evaluate eval_rl",
        f"gpu=2 tag=gpu_hot {HOT} variants=[] sft=/sft evaluate eval_base",
    ]


def test_a_failed_variant_fails_the_run_after_the_others_end(tmp_path: Path) -> None:
    status, calls = _run(tmp_path, "rl", *VARIANTS, FAIL_TAG="gpu", CURRICULUM="difficulty")
    assert status == 3
    assert len(calls) == 2


def test_more_variants_than_gpus_are_refused(tmp_path: Path) -> None:
    status, calls = _run(tmp_path, "rl", *VARIANTS, gpus=1)
    assert status == 2 and calls == []


def test_all_trains_sft_first_then_rl_from_the_chosen_checkpoint_and_evaluates_the_rest(
    tmp_path: Path,
) -> None:
    """A variant whose RL failed does not stop the others' evaluation."""
    status, calls = _run(tmp_path, "all", *VARIANTS, sft="-", FAIL_TAG="gpu")
    assert status == 0
    assert "gpu=0,1 tag= set=[] variants=[] sft=- sft" in calls
    assert "gpu=0 tag=gpu set=[] variants=[] sft=/gpu/ck-75 rl" in calls
    assert f"gpu=1 tag=gpu_hot {HOT} variants=[] sft=/gpu/ck-75 evaluate eval_rl" in calls


def test_on_one_gpu_the_held_out_sweeps_run_one_after_the_other(tmp_path: Path) -> None:
    """Two environments on one GPU time each other's kernels and overdraw its memory
    (benchmarks/README.md, "Learning benchmark"): SFT's sweep ends before RL's starts."""
    status, calls = _run(tmp_path, "evaluate", VARIANTS[1], gpus=1)
    assert status == 0
    assert f"gpu=0 tag=gpu_hot {HOT} variants=[] sft=/sft evaluate eval_rl" in calls
    order = (tmp_path / "bench" / "order.txt").read_text().splitlines()
    assert order == ["end eval_sft", "start eval_rl"]


def test_each_variant_runs_on_its_own_share_of_the_cores(tmp_path: Path) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores")
    status, _ = _run(tmp_path, "rl", *VARIANTS)
    assert status == 0
    cores = {
        line.split()[0]: set(line.split()[1:])
        for line in (tmp_path / "bench" / "cores.txt").read_text().splitlines()
    }
    assert cores["0"] and cores["1"] and not cores["0"] & cores["1"]
