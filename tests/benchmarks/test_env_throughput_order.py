"""The orders the throughput benchmark submits a pass in, run through a real pool on the CPU: one
batch the pool takes longest-first, or one batch a round."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import env_throughput  # noqa: E402

from kernelrl.data.bundled import bundled_pairs  # noqa: E402
from kernelrl.env.evaluator import EvalConfig  # noqa: E402
from kernelrl.env.pools.local import LocalPool  # noqa: E402


@pytest.fixture(scope="module")
def started() -> dict[str, list[str]]:
    """Each order's task ids in the order their evaluations started, on one slot (which takes
    its queue as the pool ordered it): two tasks, two repeats each."""
    pairs = [(t, s) for t, s in bundled_pairs("triton") if t.id in ("01_relu", "06_row_sum")]
    config = EvalConfig(device="cpu", timeout_s=60, host_memory_bytes=2 * 2**30)
    orders = {}
    with LocalPool(config, workers=1) as pool:
        for order in ("pool", "rounds"):
            results, _, _ = env_throughput.run_pass(pool, pairs, 2, True, order, order)
            assert [r.status.value for r in results] == ["correct"] * 4
            orders[order] = [r.task_id for r in sorted(results, key=lambda r: r.timestamp)]
    return orders


def test_one_batch_starts_a_task_s_evaluations_together(started: dict[str, list[str]]) -> None:
    first = started["pool"]
    assert first[0] == first[1] and first[2] == first[3] != first[0]


def test_a_batch_a_round_starts_every_task_before_any_twice(
    started: dict[str, list[str]],
) -> None:
    rounds = started["rounds"]
    assert sorted(rounds[:2]) == sorted(rounds[2:]) == ["01_relu", "06_row_sum"]
