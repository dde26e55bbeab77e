"""Runs the CPU smoke curation once per test session; its output serves several test modules.

Not a test module: ``test_curate_smoke.py`` checks the curation, ``test_sft.py`` trains on its
output. The run is the real command line (``python -m kernelrl.launch.cli curate``) in a
subprocess, exactly as a user or CI runs it.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "curate" / "smoke_cpu.yaml"


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        WANDB_MODE="offline",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    return env


def run_cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kernelrl.launch.cli", *args],
        cwd=ROOT,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@functools.lru_cache(maxsize=1)
def smoke_curation() -> tuple[Path, subprocess.CompletedProcess]:
    """(output folder, finished process) of ``kernelrl curate --config smoke_cpu.yaml``."""
    folder = Path(tempfile.mkdtemp(prefix="kernelrl-curate-smoke-"))
    atexit.register(shutil.rmtree, folder, True)
    out = folder / "smoke_cpu"
    process = run_cli("curate", "--config", str(RECIPE), "--output_dir", str(out))
    return out, process
