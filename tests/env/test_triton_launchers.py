"""Triton's launchers built once per worker from the signatures children report
(``env/sandbox/triton_launchers.py``): what a report may ask for, and on a GPU, that a child
finds the worker's launcher instead of building its own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernelrl.env.sandbox import triton_launchers
from kernelrl.env.sandbox.triton_launchers import (
    MAX_ARGUMENTS,
    MAX_LAUNCHERS,
    MAX_PER_MESSAGE,
    LaunchersMade,
    SharedLaunchers,
    launcher_signature,
)

ROOT = Path(__file__).resolve().parents[2]


def test_a_signature_is_taken_only_as_triton_writes_one() -> None:
    assert launcher_signature(["*fp32", "*kfp16", "i32", "fp32", "constexpr"]) == (
        "*fp32",
        "*kfp16",
        "i32",
        "fp32",
        "constexpr",
    )
    assert launcher_signature(["*fp32", ["i32", ["i64"]]]) == ("*fp32", ("i32", ("i64",)))
    for refused in (
        "i32",  # not a list
        [],
        ["i32", 'i32 a); system("id"); (int'],  # C text where a type goes
        ["*fp32 x; int y"],
        ["tensordesc<fp16[64, 64]>"],  # needs the compile's metadata: the child builds it
        ["i32", {"type": "i32"}],
        ["i32", 7],
        [[[["i32"]]]],  # nested deeper than Triton's tuples go here
        ["i32"] * (MAX_ARGUMENTS + 1),
    ):
        assert launcher_signature(refused) is None, refused


def test_a_child_s_report_is_bounded_and_taken_once() -> None:
    shared = SharedLaunchers()
    assert shared.accept({"not": "a list"}) == []
    assert shared.accept([["i32"], "junk", ["i32"], [None]]) == [("i32",)]
    assert shared.accept([["i32"]]) == []  # taken before
    many = [["*fp32"] * n for n in range(1, 2 * MAX_PER_MESSAGE)]
    assert len(shared.accept(many)) == MAX_PER_MESSAGE
    others = [["i32"] * a + ["i64"] * b for a in range(1, 40) for b in range(1, 40)]
    for start in range(0, len(others), MAX_PER_MESSAGE):
        shared.accept(others[start : start + MAX_PER_MESSAGE])
    assert len(shared.known) == MAX_LAUNCHERS


def test_a_child_reports_each_signature_once_and_keeps_launching_whatever_it_is() -> None:
    made = LaunchersMade({})
    made.note(["*fp32", "i32"])
    made.note(["*fp32", "i32"])
    made.note(["*fp32", object()])  # nothing JSON can say: not reported, and no error
    made.note(["*fp32", ("i32", "i64")])
    assert made.take() == [["*fp32", "i32"], ["*fp32", ("i32", "i64")]]
    made.note(["*fp32", "i32"])
    assert made.take() == []  # each one goes to the worker once


def test_the_builder_refuses_what_is_not_a_signature() -> None:
    done = subprocess.run(
        [sys.executable, "-m", triton_launchers.__name__],
        input=json.dumps([["i32", "int x; #include </etc/passwd>"]]),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "not a launcher's signature" in done.stderr


RUN_WITHOUT_BUILDING = """
import importlib.util, sys, torch, triton
def refused(name, *args):
    raise RuntimeError(f"built {name} with the C compiler")
triton.knobs.build.impl = refused
spec = importlib.util.spec_from_file_location("solution", sys.argv[1])
solution = importlib.util.module_from_spec(spec)
spec.loader.exec_module(solution)
x = torch.randn(4096, device="cuda")
assert torch.equal(solution.ModelNew().cuda()(x), torch.relu(x))
"""


@pytest.mark.gpu
def test_a_child_finds_the_launcher_the_worker_built_from_another_s_report(tmp_path) -> None:
    from kernelrl.env.evaluator import EvalConfig
    from kernelrl.env.pools.local import LocalPool
    from kernelrl.env.sandbox.triton_seed import triton_seed
    from kernelrl.env.task import load_task

    shared = triton_launchers.shared_launchers()
    if not shared.enabled:
        pytest.skip("this Triton builds no launcher per signature")
    solution = ROOT / "data" / "solutions" / "triton" / "01_relu.py"
    task = load_task(ROOT / "data" / "tasks" / "01_relu.py")
    with LocalPool(EvalConfig(device="cuda", timeout_s=120), workers=1) as pool:
        (result,) = pool.evaluate([task], [solution.read_text()])
    assert result.correct, result.error
    assert shared.wait(120.0)
    assert shared.known and any(shared.folder.glob("*/__triton_launcher*"))

    alone, shared_too = tmp_path / "seed_alone", tmp_path / "seed_and_launchers"
    for cache in (alone, shared_too):  # what spawn gives a child: the seed, then the launchers
        shutil.copytree(triton_seed("cuda", 0), cache)
    shared.copy_into(shared_too)
    runs = {
        cache: subprocess.run(
            [sys.executable, "-c", RUN_WITHOUT_BUILDING, str(solution)],
            env={**os.environ, "TRITON_CACHE_DIR": str(cache)},
            capture_output=True,
            text=True,
            timeout=300,
        )
        for cache in (alone, shared_too)
    }
    assert runs[shared_too].returncode == 0, runs[shared_too].stderr[-3000:]
    assert "built __triton_launcher" in runs[alone].stderr  # the seed alone has none for it
