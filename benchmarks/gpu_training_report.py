"""What the GPU training benchmark reports: weight changes that a bf16 save cannot fake, the
RL step split into generation, evaluation and update, and the tables of ``results.md``."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def weight_stats(path: Path) -> dict[str, float] | None:
    """Checksum (sum and sum of squares in float64) of every tensor of a saved model."""
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    if not files:
        return None
    total = squares = 0.0
    count = 0
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open is not iterable)
                tensor = handle.get_tensor(key).double()
                total += tensor.sum().item()
                squares += tensor.square().sum().item()
                count += tensor.numel()
    return {"sum": total, "sum_sq": squares, "numel": count}


def weight_change(before: Path, after: Path) -> dict[str, Any] | None:
    """Largest absolute change of any parameter between two saved models, tensor by tensor.
    DeepSpeed saves bf16 weights: the earlier model is rounded to the later one's dtype first,
    so a cast alone never counts as a change (changes below bf16's resolution do not either)."""
    import torch
    from safetensors import safe_open

    old_files = sorted(before.glob("*.safetensors"))
    new_files = sorted(after.glob("*.safetensors"))
    if not old_files or not new_files:
        return None

    def load(files: list[Path]) -> dict[str, torch.Tensor]:
        tensors = {}
        for file in files:
            with safe_open(str(file), framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118 (safe_open is not iterable)
                    tensors[key] = handle.get_tensor(key)
        return tensors

    old, new = load(old_files), load(new_files)
    common = sorted(set(old) & set(new))
    deltas = {
        k: (new[k].float() - old[k].to(new[k].dtype).float()).abs().max().item() for k in common
    }
    return {
        "tensors": len(common),
        "tensors_changed": sum(1 for d in deltas.values() if d > 0),
        "max_abs_change": max(deltas.values(), default=0.0),
        "dtype_before": str(next(iter(old.values())).dtype),
        "dtype_after": str(next(iter(new.values())).dtype),
        "checksum_before": weight_stats(before),
        "checksum_after": weight_stats(after),
    }


def _breakdown(history: list[dict[str, Any]]) -> dict[str, float | None]:
    """Mean seconds per RL step: generation (all turns), waiting for evaluations (between turns
    and for the rewards), the rest of rollout and scoring, and the update (forward and backward
    of the loss: TRL's step time minus rollout and scoring)."""

    def mean(key: str) -> float | None:
        values = [e[key] for e in history if e.get(key) is not None]
        return round(sum(values) / len(values), 3) if values else None

    step, rollout = mean("step_time"), mean("timing/rollout_and_score_s")
    generation = mean("timing/generation_s")
    evaluation = None
    if mean("timing/turn_eval_wait_s") is not None or mean("timing/reward_wait_s") is not None:
        evaluation = round(
            (mean("timing/turn_eval_wait_s") or 0) + (mean("timing/reward_wait_s") or 0), 3
        )
    update = round(step - rollout, 3) if step is not None and rollout is not None else None
    return {
        "step_s": step,
        "generation_s": generation,
        "evaluation_wait_s": evaluation,
        "rollout_and_score_s": rollout,
        "update_s": update,
    }


def markdown(results: dict[str, Any]) -> str:
    """The tables for benchmarks/README.md."""
    lines = [
        "| stage | launched as | status | steps | wall s | first step s | median step s "
        "| peak alloc GiB (trainer; CPU: peak RSS) | GPU used GiB (all) | check |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, stage in results["stages"].items():
        if stage.get("status") in ("skipped", "not_run"):
            lines.append(
                f"| {name} | | {stage['status']}: {stage.get('reason', '')} | | | | | | | |"
            )
            continue
        lines.append(
            "| {name} | {launch} | {status} | {steps} | {wall} | {first} | {median} | {alloc} | {used} | {check} |".format(
                name=name,
                launch=f"{stage.get('distributed_type')}, ZeRO {stage.get('zero_stage')}",
                status=stage["status"],
                steps=stage.get("global_step"),
                wall=stage.get("wall_s"),
                first=stage.get("first_step_s"),
                median=stage.get("median_step_s"),
                alloc=stage.get("peak_allocated_gib") or stage.get("peak_rss_gib"),
                used=stage.get("gpu_used_peak_gib"),
                check=_check(stage),
            )
        )
    lines += [
        "",
        "| RL stage | step s | generation s | evaluation wait s | rollout+score s | update s |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, stage in results["stages"].items():
        b = stage.get("breakdown")
        if b:
            lines.append(
                f"| {name} | {b['step_s']} | {b['generation_s']} | {b['evaluation_wait_s']} | "
                f"{b['rollout_and_score_s']} | {b['update_s']} |"
            )
    return "\n".join(lines) + "\n"


def _check(stage: dict[str, Any]) -> str:
    if "loss_after_resume" in stage:
        return (
            f"loss {stage.get('loss_initial')} -> {stage.get('loss_at_checkpoint')} (step "
            f"{stage.get('resumed_from_step')}) -> {stage.get('loss_after_resume')} after resume"
        )
    if stage.get("command") == "sft" and stage.get("loss"):
        return f"loss {stage['loss'][0][1]} -> {stage['loss'][-1][1]}"
    if stage.get("command") == "train":
        rewards = [e.get("reward") for e in stage.get("log", [])]
        weights = stage.get("weights") or {}
        return (
            f"rewards {rewards}; tensors changed {weights.get('tensors_changed')}/"
            f"{weights.get('tensors')}, max abs change {_round(weights.get('max_abs_change'), 6)}"
        )
    return ""


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _round(value: Any, digits: int = 3) -> Any:
    return round(value, digits) if isinstance(value, float) else value


def _tail(path: Path, lines: int) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []
