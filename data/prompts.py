"""The prompt an RL task row carries, built by the same ``PromptBuilder`` as evaluation sweeps.

Stored in the dataset (column ``prompt``, conversational format) so that a curated dataset is
directly usable by TRL trainers, and so that a policy is trained on the prompt it is evaluated
with. A recipe can pass its own template file (``string.Template`` placeholders, see
``kernelrl.eval.prompts``).
"""

from __future__ import annotations

from pathlib import Path

from kernelrl.eval.prompts import BACKEND_NAMES, PromptBuilder

SYSTEM = (
    "You are an expert GPU kernel engineer. You replace PyTorch operators with custom kernels "
    "that are correct and faster than PyTorch."
)


def prompt_builders(
    template_path: str | Path | None = None, system: str | None = SYSTEM, one_shot: bool = True
) -> dict[str, PromptBuilder]:
    """One builder per backend; a bad template file fails here, before any row is built."""
    return {
        backend: PromptBuilder.from_file(
            template_path, backend=backend, one_shot=one_shot, system_prompt=system or ""
        )
        for backend in BACKEND_NAMES
    }
