"""Multi-turn RL trajectories -> SFT examples of successful revisions.

A revision is a turn ``t >= 1`` whose solution the environment judged correct (no failed
check) while turn ``t - 1`` was not, or was correct but slower by ``revision_min_improvement``
(only where timings mean something). The example's prompt is the conversation up to that turn:
the task prompt, the earlier attempts as assistant turns and the environment's feedback as user
turns (all of them, or only the last attempt with ``revision_history="last"``); its completion
is the revised answer. This teaches what the model must do at RL time: read feedback and fix.
The examples then go through ``select_sft`` like any sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from datasets import Dataset
from rich.console import Console

from kernelrl.data.curate.report import StepReport, log_step, timed
from kernelrl.data.curate.sft_select import sft_row
from kernelrl.data.schema import make_dataset, result_of
from kernelrl.env.result import EvalResult


@dataclass
class RevisionConfig:
    """The revision keys of the SFT step (parsed next to ``CurateConfig``)."""

    revision_history: str = field(
        default="full",
        metadata={"help": "full: every earlier turn; last: only the attempt being revised"},
    )
    revision_min_improvement: float = field(
        default=1.1, metadata={"help": "a correct -> correct revision must be this much faster"}
    )
    # Fixed setting, not a recipe key: text put before the environment's feedback.
    feedback_prefix: str = field(default="", init=False)


def _improved(before: EvalResult | None, after: EvalResult, config: RevisionConfig) -> str | None:
    """Why ``after`` is a successful revision of ``before``, or None."""
    if not after.correct or after.checks_failed:
        return None
    if before is None or not before.correct or before.checks_failed:
        return f"fixes {before.status if before else 'an unmeasured attempt'}"
    if after.timing_meaningful and before.speedup_vs_eager and after.speedup_vs_eager:
        gain = after.speedup_vs_eager / before.speedup_vs_eager
        if gain >= config.revision_min_improvement:
            return f"{gain:.2f}x faster"
    return None


def trajectories_to_sft(
    trajectories: Dataset,
    config: RevisionConfig | None = None,
    reasoning_format: str = "think",
    console: Console | None = None,
) -> tuple[Dataset, StepReport]:
    """One SFT row per successful revision; trajectories without one are reported."""
    config = config or RevisionConfig()
    if config.revision_history not in ("full", "last"):
        raise ValueError(f"revision_history must be full or last, got {config.revision_history!r}")
    report = StepReport("trajectories_to_sft", count_in=len(trajectories))
    rows: list[dict[str, Any]] = []
    with timed(report):
        for trajectory in trajectories:
            turns = trajectory["turns"] or []
            results = [result_of(turn["result"]) for turn in turns]
            found = 0
            for t in range(1, len(turns)):
                after = results[t]
                if after is None:
                    continue
                why = _improved(results[t - 1], after, config)
                if why is None:
                    continue
                first = 0 if config.revision_history == "full" else t - 1
                messages = list(trajectory["prompt"] or [])
                for earlier in range(first, t):
                    feedback = turns[earlier]["feedback"] or (
                        results[earlier].feedback if results[earlier] else ""
                    )
                    messages.append(
                        {"role": "assistant", "content": turns[earlier]["completion"] or ""}
                    )
                    messages.append({"role": "user", "content": config.feedback_prefix + feedback})
                row = sft_row(
                    f"{trajectory['id']}/turn{t}",
                    trajectory["task_id"],
                    messages,
                    turns[t]["completion"] or "",
                    after,
                    "revision",
                    t,
                    trajectory["origin"] or "",
                    reasoning_format,
                )
                rows.append(row)
                found += 1
            if not found:
                report.remove(
                    trajectory["id"],
                    "no_successful_revision",
                    f"{len(turns)} turns, none revises a failure into a success",
                )
    result = make_dataset(rows, "sft")
    report.count_out = len(result)
    report.notes["unit"] = "trajectories in, revision examples out"
    log_step(report, console)
    return result, report
