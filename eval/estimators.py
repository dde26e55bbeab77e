"""The estimators of sweep metrics, with their intervals; they know numbers, not records.

- pass@k: the unbiased estimator of Chen et al. (2021), 1 - C(n-c, k) / C(n, k) for a task with
  n samples of which c are correct;
- Wilson score intervals for rates (attempts treated as independent trials);
- percentile bootstrap (deterministic for a seed) for the mean pass@k over tasks (Wilson over
  tasks where every task scores exactly 0 or 1, where a bootstrap degenerates to ``[0, 0]`` or
  ``[1, 1]``) and for the geometric-mean speedup (resampling attempts).

``kernelrl.eval.metrics`` says what is counted; this module, how it is estimated.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task (Chen et al. 2021), in the numerically stable product form."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def _z(confidence: float) -> float:
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    if n == 0:
        return (0.0, 1.0)
    z = _z(confidence)
    p = successes / n
    denominator = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return (max(0.0, center - half), min(1.0, center + half))


def bootstrap_interval(
    values: Sequence[float],
    statistic: Callable[[Sequence[float]], float],
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap; deterministic for a given seed."""
    if not values:
        return (math.nan, math.nan)
    rng = random.Random(seed)
    n = len(values)
    stats = sorted(
        statistic([values[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples)
    )
    alpha = (1 - confidence) / 2
    low = stats[min(resamples - 1, max(0, math.floor(alpha * resamples)))]
    high = stats[min(resamples - 1, max(0, math.ceil((1 - alpha) * resamples) - 1))]
    return (low, high)


def geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


@dataclass
class Estimate:
    value: float | None
    low: float | None = None
    high: float | None = None
    count: int | None = None  # successes, for rates
    n: int = 0  # trials (rates, geomean) or tasks (pass@k)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def rate(flags: Sequence[bool], confidence: float) -> Estimate:
    n, count = len(flags), sum(flags)
    if n == 0:
        return Estimate(None, n=0, count=0)
    low, high = wilson_interval(count, n, confidence)
    return Estimate(count / n, low, high, count, n)


@dataclass
class StatsConfig:
    pass_ks: Sequence[int] = (1,)
    confidence: float = 0.95
    bootstrap_samples: int = 2000
    seed: int = 0


def pass_at_k_estimate(values: Sequence[float], config: StatsConfig) -> tuple[Estimate, str]:
    """Mean pass@k over tasks with its interval, and which interval it is: a percentile
    bootstrap over tasks, except where every task scores exactly 0 or 1 (k of k samples, one
    sample each, nothing solved). Those tasks are Bernoulli trials, so the interval is Wilson's,
    as for rates; a bootstrap of all-0 (or all-1) values could only return ``[0.0%, 0.0%]``."""
    value = mean(values)
    if all(v in (0.0, 1.0) for v in values):
        solved = sum(v == 1.0 for v in values)
        low, high = wilson_interval(solved, len(values), config.confidence)
        return Estimate(value, low, high, n=len(values)), "wilson over tasks"
    if len(set(values)) == 1:  # e.g. one task: every resample is the same value
        return Estimate(value, n=len(values)), "none: every task has the same pass@k"
    low, high = bootstrap_interval(
        values, mean, config.confidence, config.bootstrap_samples, config.seed
    )
    return Estimate(value, low, high, n=len(values)), "bootstrap over tasks"
