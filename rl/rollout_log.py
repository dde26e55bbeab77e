"""Every trained rollout as one line of JSON (``save_rollouts``): what the policy wrote, what the
environment said, and the reward and advantage each turn was trained with.

Aggregate curves say that a run moved, not what it reinforced; these records say which answers
of which tasks it pushed up or down. They are the trajectory format that curation reads
(``kernelrl curate --trajectory_sources jsonl:RUN/rollouts/rank0.jsonl``), so a run's rollouts
are also curation input.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import Tensor

from kernelrl.rl.rollout import Trajectory


def rollout_records(
    trajectories: Sequence[Trajectory], rewards: Tensor, advantages: Tensor, step: int
) -> list[dict[str, Any]]:
    """One record per trajectory; ``rewards`` and ``advantages`` are ``[N, T]`` (turns)."""
    records = []
    for row, trajectory in enumerate(trajectories):
        turns = [
            {
                "completion": turn.text,
                "truncated": turn.truncated,
                "result": None if result is None else result.to_dict(),
                "error": turn.error,
                "reward": float(rewards[row, index]),
                "advantage": float(advantages[row, index]),
            }
            for index, (turn, result) in enumerate(
                zip(trajectory.turns, trajectory.results(), strict=True)
            )
        ]
        records.append(
            {
                "id": f"{trajectory.task.id}/step{step}/{row}",
                "task_id": trajectory.task.id,
                "step": step,
                "policy_step": trajectory.policy_step,
                "stop_reason": trajectory.stop_reason,
                "turns": turns,
            }
        )
    return records


def append_records(path: Path, records: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
