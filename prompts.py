"""Prompts in the KernelBench style: the task's PyTorch reference, a one-shot example for the
backend, and the instruction to answer with a ``ModelNew`` in one code block.

One module below ``eval``, ``data`` and ``rl`` (it imports only ``env``): evaluation sweeps,
the prompts stored in curated task rows and the prompts RL samples from are built by the same
``PromptBuilder``, so that a policy is trained on the prompt it is evaluated with.

Why KernelBench's structure (reference, one-shot pair, one-code-block answer; the wording is our
own): numbers from a sweep are only comparable with published KernelBench numbers when the model
sees the same kind of prompt. A template file can replace it
(``string.Template`` placeholders, because kernel code is full of ``{}``):

- ``$reference``: the task's source (kernelrl metadata removed),
- ``$backend_name``: "Triton" or "CUDA",
- ``$example_reference`` / ``$example_solution``: the one-shot pair of the backend,
- ``$example``: the whole one-shot paragraph (empty when ``one_shot`` is off).

Refinement turns continue the conversation: the earlier attempt as the assistant's message,
then the revision message, ``FEEDBACK_TEMPLATE`` with the environment's feedback in it
(``str.format``; a recipe's ``feedback_template``). Training's multi-turn rollouts and
evaluation sweeps use the same one by default, so a policy is revised as it was trained.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from kernelrl.env.backends import BACKENDS, get_backend
from kernelrl.env.parse import FormatError, strip_reasoning
from kernelrl.env.task import Task, strip_metadata

# The system message of RL task rows (``kernelrl train``, ``kernelrl curate``).
SYSTEM = (
    "You are an expert GPU kernel engineer. You replace PyTorch operators with custom kernels "
    "that are correct and faster than PyTorch."
)

# The user message after an attempt, in training and evaluation alike: ``{feedback}`` is the
# environment's feedback text.
FEEDBACK_TEMPLATE = (
    "Your answer was evaluated. Result:\n\n{feedback}\n\nImprove ModelNew: fix every problem "
    "reported above, and make it faster if it is already correct. Output the complete new code "
    "in a single ```python code block."
)

EXAMPLE_REFERENCE = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, a, b):
        return a + b


def get_inputs():
    a = torch.randn(1, 128)
    b = torch.randn(1, 128)
    return [a, b]


def get_init_inputs():
    return []
"""

EXAMPLE_SOLUTIONS = {
    "triton": """import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    a = tl.load(a_ptr + offsets, mask=mask)
    b = tl.load(b_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, a + b, mask=mask)


def elementwise_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a = a.contiguous()
    b = b.contiguous()
    out = torch.empty_like(a)
    n_elements = out.numel()
    grid = (triton.cdiv(n_elements, 1024),)
    add_kernel[grid](a, b, out, n_elements, BLOCK_SIZE=1024)
    return out


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, a, b):
        return elementwise_add(a, b)
""",
    "cuda": '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void elementwise_add_kernel(const float* a, const float* b, float* out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

torch::Tensor elementwise_add(torch::Tensor a, torch::Tensor b) {
    auto a_c = a.contiguous();
    auto b_c = b.contiguous();
    auto out = torch::empty_like(a_c);
    int64_t n = a_c.numel();
    const int threads = 256;
    const int blocks = (int)((n + threads - 1) / threads);
    elementwise_add_kernel<<<blocks, threads>>>(
        a_c.data_ptr<float>(), b_c.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""

cpp_source = "torch::Tensor elementwise_add(torch::Tensor a, torch::Tensor b);"

elementwise_add = load_inline(
    name="elementwise_add",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["elementwise_add"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, a, b):
        return elementwise_add.elementwise_add(a, b)
''',
}

# Per registered backend (``env/backends.py``): how its kernels are written, and the one-shot
# solution above.
_HOW = {
    "triton": "Triton kernels (``@triton.jit`` functions launched from ``forward``)",
    "cuda": "CUDA kernels embedded inline with ``torch.utils.cpp_extension.load_inline``",
}

DEFAULT_TEMPLATE = """Task: make a PyTorch module faster by writing $backend_name kernels.

Below is a module named Model. Write a module named ModelNew that computes the same outputs from \
the same inputs, with the same constructor arguments, and does its main work in your own \
$backend_name kernels. Which operators you replace is up to you: one kernel per operator, one \
fused kernel for several of them (a matmul with its activation, say), or a different algorithm \
for the same result (an online softmax, say). Outputs are checked against Model on fresh random \
inputs, then timed.
$example
The module to speed up:

```python
$reference
```

Answer with the complete code of ModelNew (imports, kernels and the module) in one ```python \
code block. The code must run as it is: no pseudocode, no placeholders, no test or benchmark \
code.
"""

EXAMPLE_PARAGRAPH = """
Here is what $how look like, on a small example. This module:

```python
$example_reference
```

becomes:

```python
$example_solution
```
"""


@dataclass
class MultiTurnConfig:
    """How many attempts a sample gets and what the environment says between them: the same
    keys, checked the same way, in training and evaluation recipes (each extends this)."""

    #: Evaluation keys of before there was one multi-turn config (old -> new).
    RENAMED_KEYS: ClassVar[dict[str, str]] = {
        "turns": "max_turns",
        "stop_on_correct": "stop_when_correct",
    }

    max_turns: int = field(
        default=1,
        metadata={"help": "attempts per sample: write, get the environment's feedback, revise"},
    )
    stop_when_correct: bool = field(
        default=True, metadata={"help": "end a sample at its first correct attempt"}
    )
    feedback_template: str = field(
        default=FEEDBACK_TEMPLATE,
        metadata={"help": "the message after an attempt; {feedback} is the environment's feedback"},
    )

    def check_turns(self) -> None:
        """Called by the configs that extend this one, from their own ``__post_init__``."""
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if "{feedback}" not in self.feedback_template:
            raise ValueError("feedback_template must contain {feedback}")


def revision_message(template: str, feedback: str) -> str:
    """The user message after an attempt; a template without ``{feedback}`` is refused."""
    if "{feedback}" not in template:
        raise ValueError("feedback_template must contain {feedback}")
    return template.format(feedback=feedback)


def answer_of(completion: str) -> str:
    """An earlier answer as it goes back into the conversation: its reasoning is not kept, and a
    completion that never left its reasoning has no answer to show."""
    try:
        return strip_reasoning(completion).strip()
    except FormatError:
        return ""


@dataclass
class PromptBuilder:
    """Builds the first prompt of a task and the conversation of a refinement turn."""

    backend: str = "triton"
    template: str = DEFAULT_TEMPLATE
    one_shot: bool = True
    system_prompt: str = ""
    history_turns: int = 1
    feedback_template: str = FEEDBACK_TEMPLATE

    @classmethod
    def from_file(cls, path: str | Path | None, **kwargs: object) -> PromptBuilder:
        if not path:
            return cls(**kwargs)  # type: ignore[arg-type]
        try:
            template = Path(path).read_text()
        except OSError as exc:
            raise ValueError(f"cannot read prompt template {path}: {exc.strerror or exc}") from exc
        if not re.search(r"\$(reference\b|\{reference\})", template):
            raise ValueError(f"prompt template {path} has no $reference placeholder")
        builder = cls(template=template, **kwargs)  # type: ignore[arg-type]
        builder.render(EXAMPLE_REFERENCE)  # a bad placeholder fails now, not mid-run
        return builder

    def _values(self, source: str) -> dict[str, str]:
        name = get_backend(self.backend).display_name
        example_solution = EXAMPLE_SOLUTIONS[self.backend].strip()
        values = {
            "backend_name": name,
            "how": _HOW[self.backend],
            "example_reference": EXAMPLE_REFERENCE.strip(),
            "example_solution": example_solution,
            "reference": strip_metadata(source).strip(),
        }
        values["example"] = (
            string.Template(EXAMPLE_PARAGRAPH).substitute(values) if self.one_shot else ""
        )
        return values

    def render(self, source: str) -> str:
        """The first user message for a task given by its reference source."""
        try:
            return string.Template(self.template).substitute(self._values(source))
        except KeyError as exc:
            raise ValueError(f"prompt template: unknown placeholder ${exc.args[0]}") from exc
        except ValueError as exc:
            raise ValueError(f"prompt template: {exc} (write $$ for a literal $)") from exc

    def first_prompt(self, task: Task) -> str:
        return self.render(task.source)

    def first_messages(self, source: str) -> list[dict[str, str]]:
        """The conversation of a task's first turn: the system message (if any) and the prompt."""
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages.append({"role": "user", "content": self.render(source)})
        return messages

    def conversation(
        self, task: Task, attempts: Sequence[tuple[str, str]] = ()
    ) -> list[dict[str, str]]:
        """Chat messages for the next turn. ``attempts``: earlier (completion, feedback) pairs,
        oldest first; only the last ``history_turns`` of them are shown."""
        messages = self.first_messages(task.source)
        for completion, feedback in list(attempts)[-self.history_turns :] if attempts else []:
            messages.append({"role": "assistant", "content": answer_of(completion)})
            messages.append(
                {
                    "role": "user",
                    "content": revision_message(
                        self.feedback_template, feedback.strip() or "(no feedback)"
                    ),
                }
            )
        return messages


def prompt_builders(
    template_path: str | Path | None = None, system: str | None = SYSTEM, one_shot: bool = True
) -> dict[str, PromptBuilder]:
    """One builder per backend, for task rows of either backend; a bad template file fails
    here, before any row is built."""
    return {
        backend: PromptBuilder.from_file(
            template_path, backend=backend, one_shot=one_shot, system_prompt=system or ""
        )
        for backend in BACKENDS
    }
