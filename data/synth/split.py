"""Splits by operator combination: held-out tasks combine known operators in unseen ways.

A task's combination is its operator kinds in order (``Graph.combination``). Whole
combinations are assigned to a split, never single tasks, so no combination of ``heldout`` or
``validation`` occurs in ``train``. A combination may leave ``train`` only while every one of
its operators still occurs in some combination that stays: each operator of a held-out task
was seen in training, in other company. ``validation`` is drawn the same way as ``heldout``
and apart from it: settings are chosen on validation and reported on held-out. With
``min_pointwise``, only chains of at least that many pointwise operators leave training: the
evaluation splits then hold chains longer than any reference solution (``SynthConfig``'s
``reference_max_pointwise``), which measures what training has to add to the references.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

from kernelrl.data.synth.graph import pointwise_in

SPLITS = ("train", "validation", "heldout")


def _ops(combination: str) -> set[str]:
    return set(combination.split(">"))


def split_combinations(
    combinations: Sequence[str],
    heldout_share: float,
    validation_share: float,
    seed: int,
    min_pointwise: int = 0,
) -> dict[str, str]:
    """combination -> split. Shares are of tasks (combinations weighted by their counts) and
    are reached as closely as the operator constraint allows."""
    counts = Counter(combinations)
    order = sorted(counts)
    random.Random(seed).shuffle(order)
    # How many training combinations contain each operator: one may leave training only while
    # every operator it holds stays in at least one other.
    in_train: Counter[str] = Counter(op for combo in counts for op in _ops(combo))
    total = sum(counts.values())
    targets = {"heldout": heldout_share * total, "validation": validation_share * total}
    taken = {"heldout": 0, "validation": 0}
    assignment = {combo: "train" for combo in counts}
    for combo in order:
        open_splits = [
            s for s in ("heldout", "validation") if taken[s] + counts[combo] <= targets[s]
        ]
        if not open_splits or pointwise_in(combo) < min_pointwise:
            continue
        if any(in_train[op] <= 1 for op in _ops(combo)):
            continue
        split = min(open_splits, key=lambda s: taken[s] / max(targets[s], 1e-9))
        assignment[combo] = split
        taken[split] += counts[combo]
        for op in _ops(combo):
            in_train[op] -= 1
    return assignment


def check_split(
    combinations: Sequence[str], splits: Sequence[str], min_pointwise: int = 0
) -> list[str]:
    """Violations of the split's promise (empty when it holds): used by tests and the run."""
    by_split: dict[str, set[str]] = {s: set() for s in SPLITS}
    for combo, split in zip(combinations, splits, strict=True):
        by_split[split].add(combo)
    train_ops = {op for combo in by_split["train"] for op in _ops(combo)}
    problems = []
    for split in ("validation", "heldout"):
        for combo in sorted(by_split[split] & by_split["train"]):
            problems.append(f"{split} combination {combo} also in train")
        for combo in sorted(by_split[split]):
            unseen = _ops(combo) - train_ops
            if unseen:
                problems.append(f"{split} combination {combo}: {sorted(unseen)} never in train")
            if pointwise_in(combo) < min_pointwise:
                problems.append(f"{split} combination {combo}: under {min_pointwise} pointwise")
    for combo in sorted(by_split["validation"] & by_split["heldout"]):
        problems.append(f"combination {combo} in both validation and heldout")
    return problems
