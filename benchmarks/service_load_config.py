"""What one load run of the environment service is (``LoadConfig``) and what it sends: the
bundled tasks and solutions of the well-formed clients, and the bad requests with the status
each must get. Shared by the service, client and report parts of ``service_load.py``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "data" / "solutions" / "triton"
# Cheap bundled tasks (well under a second per evaluation on CPU): throughput is the service's.
TASKS = ("01_relu", "02_gelu_tanh", "04_gated_residual", "05_channel_affine", "06_row_sum")
HANGING = (
    (SOLUTIONS / "01_relu.py")
    .read_text()
    .replace(
        "        return relu(x)",
        "        while x.numel() > 0:\n            pass\n        return relu(x)",
    )
)
BROKEN_REFERENCE = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(y)


def get_inputs():
    return [torch.randn(64)]


def get_init_inputs():
    return []
"""
# Bad requests: kind -> the status it must get (a hanging solution is a well-formed request:
# its answer is the evaluator's `timeout` verdict).
BAD_KINDS = {
    "malformed_json": 400,
    "wrong_schema": 400,
    "oversized": 413,
    "slow_body": 408,
    "task_not_loading": 422,
    "reference_failing": 422,
    "hanging_solution": 200,
}


@dataclass
class LoadConfig:
    """One load run. Phases: clean (well-formed traffic only), abuse (plus bad clients and
    disconnecting clients), faults (plus a worker kill and a service restart), long (abuse
    continues; the memory figure comes from it)."""

    clients: int = 64
    phase_s: float = 60.0
    long_s: float = 300.0
    fresh_fraction: float = 0.1  # requests with a never-seen solution (a real evaluation)
    tasks: int = len(TASKS)  # the first N of TASKS; 2 repeated solutions each
    disconnect_clients: int = 4
    bad_interval_s: float = 1.0
    workers: int = 2
    per_gpu: int = 2
    timeout_s: float = 60.0  # the evaluator's limit: bounds the hanging solution
    body_timeout_s: float = 30.0
    max_body_mb: float = 1.0
    bad_kinds: str = ",".join(BAD_KINDS)  # which bad clients run (comma-separated)
    kill_worker: bool = True
    restart_service: bool = True
    restart_signal: str = "KILL"
    request_timeout_s: float = 600.0
    drain_s: float = 180.0
    out: str = "runs/service_load"
    port: int = 0
    name: str = "kernelrl-env-load"
