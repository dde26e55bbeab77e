"""The prompt an RL task row carries: KernelBench-style instructions around the reference.

Stored in the dataset (column ``prompt``, conversational format) so that a curated dataset is
directly usable by TRL trainers; a recipe can pass its own template file. The template is a
``str.format`` string with ``{source}`` and ``{backend_name}``.
"""

from __future__ import annotations

from pathlib import Path

BACKEND_NAMES = {"triton": "Triton", "cuda": "CUDA C++ (torch.utils.cpp_extension.load_inline)"}

SYSTEM = (
    "You are an expert GPU kernel engineer. You replace PyTorch operators with custom kernels "
    "that are correct and faster than PyTorch."
)

USER_TEMPLATE = """You are given the following PyTorch architecture:

```python
{source}
```

Write a new architecture named ModelNew that computes the same outputs with custom {backend_name} kernels.
Keep the constructor and forward signatures of Model. You may fuse operators or change algorithms.
Do not call PyTorch for the main computation. Answer with one complete ```python code block."""


def task_prompt(
    source: str, backend: str = "triton", template: str | None = None, system: str | None = SYSTEM
) -> list[dict[str, str]]:
    """Messages for one task: an optional system message and the user request."""
    text = (template or USER_TEMPLATE).format(
        source=source.strip("\n"), backend_name=BACKEND_NAMES.get(backend, backend)
    )
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": text})
    return messages


def read_template(path: str | Path | None) -> str | None:
    """A template file's text, or None for the built-in template."""
    if not path:
        return None
    text = Path(path).read_text()
    if "{source}" not in text:
        raise ValueError(f"prompt template {path} has no {{source}} placeholder")
    return text
