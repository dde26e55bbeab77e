"""The evaluator's options as a benchmark's flags: the timing procedure (``TimingConfig``), its
defaults those of the environment, and the ``EvalConfig`` settings a throughput run varies, so
that an alternated run (``alternate.py``) names a setting the way the library spells it."""

from __future__ import annotations

import argparse
from typing import Any

from kernelrl.env.evaluator import EvalConfig
from kernelrl.env.timing import L2_FLUSHES, TimingConfig

# (flag, TimingConfig field, type, what it sets) of the timing's numeric options.
TIMING_NUMBERS = (
    ("--warmup-ms", "warmup_ms", float, "warm-up before the first placement"),
    ("--placement-warmup-ms", "placement_warmup_ms", float, "warm-up before each later placement"),
    ("--placements", "placements", int, "input sets each timing is averaged over at least"),
    (
        "--most-placements",
        "most_placements",
        int,
        "input sets a timing may take while their mean is not known to placements_rel_err; "
        "as many as --placements: exactly those",
    ),
    (
        "--min-reps",
        "min_reps",
        int,
        "timed calls per placement before its error target may stop it",
    ),
    (
        "--enough-timed-ms",
        "enough_timed_ms",
        float,
        "a placement whose timed calls add up to this may stop before its minimum repetitions "
        "(0: never)",
    ),
)


def add_evaluator_args(parser: argparse.ArgumentParser) -> None:
    """The timing procedure's options (``TimingConfig``), compiling ahead and the admission's
    order (``EvalConfig``)."""
    for flag, field, kind, what in TIMING_NUMBERS:
        default = getattr(TimingConfig, field)
        parser.add_argument(flag, type=kind, default=default, help=f"{what} (TimingConfig)")
    parser.add_argument(
        "--l2-flush",
        choices=L2_FLUSHES,
        default=TimingConfig.l2_flush,
        help="how L2 is emptied before every timed call (TimingConfig)",
    )
    parser.add_argument(
        "--move-local-memory",
        action=argparse.BooleanOptionalAction,
        default=TimingConfig.move_local_memory,
        help="the child's local memory allocated anew before each input set where the "
        "solution's kernels need it (TimingConfig; on by default)",
    )
    parser.add_argument(
        "--compile-ahead",
        action="store_true",
        help="Triton kernels compiled by a companion sandbox without a GPU, never paused "
        "(EvalConfig.compile_ahead)",
    )
    parser.add_argument(
        "--admission-in-order",
        action=argparse.BooleanOptionalAction,
        default=EvalConfig.admission_in_order,
        help="GPU memory admitted in the order evaluations asked for it "
        "(EvalConfig.admission_in_order; on by default)",
    )
    parser.add_argument(
        "--admission-backfill",
        action=argparse.BooleanOptionalAction,
        default=EvalConfig.admission_backfill,
        help="in order, a later evaluation may start first where it fits beside the earliest "
        "waiting one's plan (EvalConfig.admission_backfill)",
    )


def timing_from_args(
    parser: argparse.ArgumentParser, args: argparse.Namespace, **fixed: Any
) -> TimingConfig:
    """The ``TimingConfig`` the flags of ``add_evaluator_args`` name, with ``fixed`` fields a
    benchmark sets itself; options it refuses end the run as the parser's one-line error."""
    flagged = {field: getattr(args, field) for _, field, _, _ in TIMING_NUMBERS}
    try:
        return TimingConfig(
            **flagged, l2_flush=args.l2_flush, move_local_memory=args.move_local_memory, **fixed
        )
    except ValueError as err:
        parser.error(str(err))
