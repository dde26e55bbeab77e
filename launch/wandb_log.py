"""wandb logging for ``kernelrl eval`` and ``kernelrl curate``, as training does it: only when
the recipe's ``report_to`` names ``wandb``, offline unless wandb finds an API key
(``kernelrl.launch.wandb_auth``; ``wandb sync`` uploads later), the run folder under the command's ``output_dir``.

A sweep logs its headline numbers (last and best turn), its turn-by-turn curve and its report
files; a curation run logs the records in and out of every step and its card. What is logged
is read from the files the command wrote, so it is what the report says.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["log_curation", "log_sweep", "wants_wandb"]


def wants_wandb(report_to: Iterable[str] | str | None) -> bool:
    if isinstance(report_to, str):
        report_to = [report_to]
    return "wandb" in (report_to or [])


def _init(job_type: str, name: str, output_dir: Path, config: Mapping[str, Any]) -> Any:
    from kernelrl.launch.wandb_auth import default_wandb_mode

    default_wandb_mode()  # offline unless wandb finds a key (env, `wandb login`'s netrc, ...)
    os.environ.setdefault("WANDB_PROJECT", "kernelrl")
    os.environ.setdefault("WANDB_SILENT", "true")  # our own line says where the run is
    output_dir.mkdir(parents=True, exist_ok=True)
    import wandb

    return wandb.init(
        project=os.environ["WANDB_PROJECT"],
        job_type=job_type,
        name=name,
        dir=str(output_dir.resolve()),
        config=dict(config),
        reinit="finish_previous",
    )


def _value(estimate: Any) -> float | None:
    return estimate.get("value") if isinstance(estimate, dict) else None


def sweep_metrics(overall: Mapping[str, Any], prefix: str) -> dict[str, float]:
    """Flat numbers of one view's headline (n/a values are left out, not logged as 0)."""
    values: dict[str, float | None] = {
        f"{prefix}/parse_rate": _value(overall["parse_rate"]),
        f"{prefix}/compile_rate": _value(overall["compile_rate"]),
        f"{prefix}/correct_rate": _value(overall["correct_rate"]),
        f"{prefix}/integrity_rate": _value(overall["integrity_rate"]),
        f"{prefix}/harness_errors": overall["harness_errors"],
        f"{prefix}/not_evaluated_tasks": len(overall["not_evaluated"]),
    }
    for baseline, by_p in overall["fast_p"].items():
        for p, estimate in by_p.items():
            values[f"{prefix}/fast_{p}_{baseline}"] = _value(estimate)
    for baseline, estimate in overall["geomean_speedup"].items():
        values[f"{prefix}/geomean_speedup_{baseline}"] = _value(estimate)
    for k, estimate in overall["pass_at_k"].items():
        values[f"{prefix}/pass@{k}"] = _value(estimate)
    return {key: float(v) for key, v in values.items() if v is not None}


def log_sweep(folder: str | Path, summary: Mapping[str, Any], config: Mapping[str, Any]) -> str:
    """One wandb run for a finished (or resumed) sweep; returns its folder."""
    import wandb

    folder = Path(folder)
    run = _init("eval", summary["run"]["run_name"], folder, config)
    try:
        for point in summary["turns"]:
            best = point["best_so_far"]
            run.log(
                {
                    "turn": point["turn"] + 1,
                    "turns/correct_at_turn": _value(point["correct_at_turn"]) or 0.0,
                    "turns/correct_best_so_far": _value(best["correct_rate"]) or 0.0,
                    "turns/compiled_best_so_far": _value(best["compile_rate"]) or 0.0,
                }
            )
        metrics = sweep_metrics(summary["views"]["last"]["overall"], "last")
        metrics |= sweep_metrics(summary["views"]["best"]["overall"], "best")
        run.summary.update(metrics | {"tasks": summary["selection"]["tasks"]})
        for name in ("summary.json", "report.md"):
            if (folder / name).exists():
                run.save(str((folder / name).resolve()), base_path=str(folder.resolve()))
        return str(Path(run.dir).parent)
    finally:
        wandb.finish()


def log_curation(
    output_dir: str | Path, reports: Iterable[Any], config: Mapping[str, Any], name: str
) -> str:
    """One wandb run for a curation: records in / out / removed and seconds of every step."""
    import wandb

    folder = Path(output_dir)
    run = _init("curate", name, folder, config)
    try:
        for index, report in enumerate(reports):
            run.log(
                {
                    "step_index": index,
                    f"steps/{report.step}/in": report.count_in,
                    f"steps/{report.step}/out": report.count_out,
                    f"steps/{report.step}/removed": len(report.removed),
                    f"steps/{report.step}/seconds": report.seconds,
                }
            )
        card = folder / "README.md"
        if card.exists():
            run.save(str(card.resolve()), base_path=str(folder.resolve()))
        return str(Path(run.dir).parent)
    finally:
        wandb.finish()
