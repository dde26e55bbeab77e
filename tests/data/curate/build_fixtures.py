"""Writes samples.jsonl and trajectories.jsonl of the curation test data.

The completions are built from kernelrl's bundled Triton solutions (correct ones), deliberate
mutations of them (wrong formula, a Triton API that does not exist, a torch fallback) and
reasoning texts of different lengths. No EvalResult is stored: the curation pipeline measures
every completion through the real environment.

    .venv/bin/python tests/data/curate/build_fixtures.py
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOLUTIONS = HERE.parents[2] / "data" / "solutions" / "triton"

GELU = (SOLUTIONS / "02_gelu_tanh.py").read_text()
SOFTMAX = (SOLUTIONS / "14_softmax_rows.py").read_text()
RESADD = (SOLUTIONS / "29_residual_add_layernorm.py").read_text()
RMSNORM = (SOLUTIONS / "11_rmsnorm.py").read_text()

GELU_SMALL_BLOCK = GELU.replace("BLOCK_SIZE=1024", "BLOCK_SIZE=512").replace(
    "cdiv(n, 1024)", "cdiv(n, 512)"
)
GELU_WRONG = GELU.replace("(x + 0.044715 * x * x * x)", "x")  # drops the cubic term
GELU_CHEAT = GELU.replace(
    "return gelu_tanh(x)",
    "gelu_tanh(x)\n        return torch.nn.functional.gelu(x, approximate='tanh')",
)
SOFTMAX_BROKEN = SOFTMAX.replace("tl.maximum(m, tl.max(x, axis=0))", "tl.running_max(m, x)")
RESADD_NO_RESIDUAL = RESADD.replace(
    "tl.load(x_ptr + row_offset + cols, mask=mask, other=0.0).to(tl.float32) + \\\n            tl.load(r_ptr + row_offset + cols, mask=mask, other=0.0).to(tl.float32)",
    "tl.load(x_ptr + row_offset + cols, mask=mask, other=0.0).to(tl.float32)",
)
assert (
    GELU_WRONG != GELU
    and GELU_CHEAT != GELU
    and SOFTMAX_BROKEN != SOFTMAX
    and RESADD_NO_RESIDUAL != RESADD
)

LONG_REASONING = (
    "Let me think about this carefully. The model applies GELU with the tanh approximation to a "
    "2D tensor. GELU(x) = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))). I could write "
    "this directly, but tanh is not always available in every Triton version, so maybe I should "
    "use exp. Let me recall the identity: 0.5 * (1 + tanh(u)) = sigmoid(2u) = 1 / (1 + exp(-2u)). "
    "So GELU(x) = x / (1 + exp(-2u)). Wait, let me double check: tanh(u) = (e^u - e^-u)/(e^u + e^-u), "
    "1 + tanh(u) = 2e^u/(e^u + e^-u) = 2/(1 + e^-2u). Yes. Now the memory layout: the tensor is "
    "contiguous, so I can flatten it and process BLOCK_SIZE elements per program. Should the "
    "block be 256, 512, 1024 or 2048? For an elementwise kernel it is memory bound, 1024 is a "
    "reasonable default. Also offsets should be int64 in case the tensor is huge. Hmm, and the "
    "mask for the tail. I think that is everything. Actually, let me reconsider the numerical "
    "stability of exp(-2u) for very negative x: exp overflows to inf and x / inf = -0, which is "
    "correct. For very positive x exp goes to 0 and we get x. Good."
)
SHORT_REASONING = (
    "GELU-tanh equals x * sigmoid(2u) with u = sqrt(2/pi)(x + 0.044715x^3). One elementwise "
    "kernel over the flattened tensor, masked tail, int64 offsets."
)


def fenced(reasoning: str, code: str) -> str:
    return f"<think>\n{reasoning}\n</think>\n\n```python\n{code.rstrip()}\n```\n"


SAMPLES = [
    {"id": "gelu/long", "task_id": "01_gelu_tanh", "completion": fenced(LONG_REASONING, GELU)},
    {
        "id": "gelu/short",
        "task_id": "01_gelu_tanh",
        "completion": fenced(SHORT_REASONING, GELU_SMALL_BLOCK),
    },
    {
        "id": "gelu/wrong",
        "task_id": "01_gelu_tanh",
        "completion": fenced("Approximate u by sqrt(2/pi) * x.", GELU_WRONG),
    },
    {
        "id": "gelu/cheat",
        "task_id": "01_gelu_tanh",
        "completion": fenced("Launch the kernel, return torch's GELU.", GELU_CHEAT),
    },
    {
        "id": "softmax/ok",
        "task_id": "02_softmax_rows",
        "completion": fenced("Online softmax: one pass for max and sum, one to write.", SOFTMAX),
    },
    {
        "id": "softmax/no_code",
        "task_id": "02_softmax_rows",
        "completion": "<think>\nA softmax needs a max and a sum.\n</think>\n\nI would use an online softmax kernel.",
    },
    {
        "id": "resadd/ok",
        "task_id": "resadd_layernorm",
        "completion": fenced("Fuse the residual add into the LayerNorm passes.", RESADD),
    },
    {
        "id": "rms/copied_task",
        "task_id": "08_rms_norm_channels",
        "completion": fenced("RMS norm over channels.", RMSNORM),
    },
    {"id": "crash/any", "task_id": "04_crashing_reference", "completion": fenced("Matmul.", GELU)},
]

TRAJECTORIES = [
    {
        "id": "traj/gelu",
        "task_id": "01_gelu_tanh",
        "turns": [
            {"completion": fenced("Approximate u by sqrt(2/pi) * x.", GELU_WRONG), "reward": 0.0},
            {
                "completion": fenced(
                    "The mismatch comes from the missing cubic term: u = sqrt(2/pi)(x + 0.044715x^3).",
                    GELU,
                ),
                "reward": 1.0,
            },
        ],
    },
    {
        "id": "traj/softmax",
        "task_id": "02_softmax_rows",
        "turns": [
            {"completion": fenced("Use a running max.", SOFTMAX_BROKEN), "reward": 0.0},
            {
                "completion": fenced(
                    "tl.running_max does not exist; combine tl.maximum with tl.max over the block.",
                    SOFTMAX,
                ),
                "reward": 1.0,
            },
        ],
    },
    {
        "id": "traj/resadd",
        "task_id": "resadd_layernorm",
        "turns": [
            {"completion": fenced("LayerNorm of x.", RESADD_NO_RESIDUAL), "reward": 0.0},
            {"completion": "I am not sure what went wrong.", "reward": 0.0},
        ],
    },
]


def main() -> None:
    with open(HERE / "samples.jsonl", "w") as out:
        for row in SAMPLES:
            out.write(json.dumps(row) + "\n")
    with open(HERE / "trajectories.jsonl", "w") as out:
        for row in TRAJECTORIES:
            out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
