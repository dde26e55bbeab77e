"""How many input sets a timing takes: the first ``placements`` always, more while the mean of
their medians is not known well enough, up to what the memory plan counted; and which sets'
outputs are kept when the count is known only at the end."""

from __future__ import annotations

import random

import pytest
import torch

from kernelrl.env import timing as timing_module
from kernelrl.env.result import TimingStats
from kernelrl.env.sandbox.timed_run import KeptOutputs
from kernelrl.env.timing import TimingConfig, fitted, placements_enough, time_fn


def _runs(medians: list[float]) -> list[TimingStats]:
    """Placements known to 0.2% each, with these medians."""
    return [TimingStats(m, m, m, m, m, 10, 0.002) for m in medians]


def test_sets_that_agree_stop_at_the_first_placements() -> None:
    config = TimingConfig(placements=4, most_placements=16, placements_rel_err=0.005)
    assert not placements_enough(_runs([1.0, 1.001, 0.999]), config)  # the first four, always
    assert placements_enough(_runs([1.0, 1.001, 0.999, 1.002]), config)


def test_sets_that_lie_apart_add_more_until_their_mean_is_known_or_the_most_are_timed() -> None:
    """A short memory-bound kernel's sets lie 3-8% apart: four leave their mean's error
    (stdev / sqrt(n)) over the target, and sets are added until it is met or the most are
    timed."""
    config = TimingConfig(placements=4, most_placements=16, placements_rel_err=0.005)
    apart = [1.0, 1.04, 0.98, 1.06]
    assert not placements_enough(_runs(apart), config)
    steady = apart + [1.02] * 12  # the later sets near the mean: the error falls under 0.5%
    counts = [n for n in range(4, 17) if placements_enough(_runs(steady[:n]), config)]
    assert counts and 4 < counts[0] < 16
    wild = [1.0, 1.1] * 8  # never known to 0.5%: stopped by the most
    assert [placements_enough(_runs(wild[:n]), config) for n in (15, 16)] == [False, True]


def test_a_long_kernel_whose_sets_spent_the_time_budget_takes_no_more() -> None:
    """Sets 6% apart, each of 100 timed calls of 2.5 ms: four spend the 1-s budget, and a
    noisy long kernel's window stays within it; the same sets of a short kernel take more."""
    config = TimingConfig(placements=4, most_placements=16, budget_s=1.0)
    medians = [2.5, 2.65, 2.5, 2.65]
    long = [TimingStats(m, m, m, m, m, 100, 0.002) for m in medians]
    short = [TimingStats(*[m / 100] * 5, 100, 0.002) for m in medians]
    assert placements_enough(long, config)
    assert not placements_enough(short, config)


def test_a_timing_is_fitted_to_the_sets_its_plan_counted() -> None:
    config = TimingConfig(placements=4, most_placements=16)
    assert (fitted(config, 10).placements, fitted(config, 10).most_placements) == (4, 10)
    assert (fitted(config, 1).placements, fitted(config, 1).most_placements) == (1, 1)
    assert fitted(config, 99).most_placements == 16
    with pytest.raises(ValueError, match="most_placements"):
        TimingConfig(placements=5, most_placements=4)
    assert config.fingerprint() != TimingConfig(most_placements=4).fingerprint()


@pytest.mark.parametrize("apart", [False, True])
def test_the_loop_times_sets_until_they_are_enough_and_the_other_side_follows_each(
    monkeypatch: pytest.MonkeyPatch, apart: bool
) -> None:
    """``time_fn``'s loop on a GPU (each set's timing replaced by its median): sets that agree
    take the first four, sets 6% apart take every one made; ``after_placement`` (the
    reference's turn when interleaved) follows every set timed and no other."""
    medians = [1.0, 1.06] * 8 if apart else [1.0] * 16
    timed: list[int] = []

    def time_placement(call, device, config, index, *rest) -> TimingStats:  # noqa: ANN001
        call()
        return _runs([medians[index]])[0]

    monkeypatch.setattr(timing_module, "time_placement", time_placement)
    turns: list[int] = []
    calls = [lambda i=i: timed.append(i) for i in range(16)]
    stats = time_fn(calls, torch.device("cuda"), TimingConfig(), after_placement=turns.append)
    expected = list(range(16 if apart else 4))
    assert timed == turns == expected
    assert len(stats.placement_medians_ms) == len(expected)


def _keep(sets: int, calls: int, count: int, seed: int) -> list[int]:
    """Which sets' outputs are kept of a timing of ``sets`` sets, ``calls`` calls each; checks
    that no more than ``count`` copies are ever held."""
    kept = KeptOutputs(count, random.Random(seed))
    for index in range(sets):
        for _ in range(calls):
            kept.offer(index, 0, torch.zeros(2), torch.device("cpu"))
            assert len(kept.outputs) <= count
    return [index for index, _, _ in kept.kept()]


def test_every_set_timed_is_as_likely_as_any_other_to_have_its_output_kept() -> None:
    """Kept outputs are drawn over the sets a timing took, which it knows only at the end: a
    solution that answered well on the first sets and badly on the ones added after them is
    checked on those as often as on the first."""
    trials, sets, count = 4000, 12, 2
    hits = [0] * sets
    for seed in range(trials):
        chosen = _keep(sets, 3, count, seed)
        assert len(chosen) == count and len(set(chosen)) == count
        for index in chosen:
            hits[index] += 1
    expected = trials * count / sets
    assert all(abs(h - expected) < 0.2 * expected for h in hits), hits
    assert _keep(3, 2, 4, 0) == [0, 1, 2]  # fewer sets than asked for: every one
    assert _keep(5, 2, 0, 0) == []


@pytest.mark.gpu
def test_on_a_gpu_sets_that_run_apart_are_timed_on_more_placements() -> None:
    """Real timings: calls that take the same time stop at the first four sets; calls whose
    sets take 5% longer every other set are timed on more (the error of four is 1.4%)."""
    from kernelrl.env.timing import _sleep_cycles_per_us

    cycles = int(100 * _sleep_cycles_per_us())  # about 0.1 ms, a short kernel's time

    def call_for(scale: float):
        return lambda: torch.cuda._sleep(int(cycles * scale))

    config = TimingConfig()
    same = time_fn([call_for(1.0)] * 16, torch.device("cuda"), config)
    apart = time_fn(
        [call_for(1.0 + 0.05 * (i % 2)) for i in range(16)], torch.device("cuda"), config
    )
    assert len(same.placement_medians_ms) == config.placements
    assert len(apart.placement_medians_ms) > config.placements
