"""benchmarks/compile_ahead_answer.py: a real companion answers the kernel it is asked for, and
the same kernel is compiled in this process, each timed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import triton.compiler
from triton import knobs

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from compile_ahead_answer import answer_and_compile  # noqa: E402

from kernelrl.env.sandbox.protocol import SOLUTION_MODULE  # noqa: E402


def test_one_companion_answers_and_the_kernel_compiles_here(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    compile_here, listener = triton.compiler.compile, knobs.compilation.listener
    try:
        answers, compiles = answer_and_compile(1)
    finally:
        sys.modules.pop(SOLUTION_MODULE, None)
    assert len(answers) == len(compiles) == 1 and min(answers + compiles) > 0
    assert (triton.compiler.compile, knobs.compilation.listener) == (compile_here, listener)
