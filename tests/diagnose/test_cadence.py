"""A cadence of slow steps is found by the position in the cycle, and claimed only where it holds in (nearly) every
cycle: hand-built step-time series, from the runs where the rule named noise or missed a real one."""

from __future__ import annotations

import random

import pytest

from lightning_perf.diagnose.cadence import cadence
from lightning_perf.diagnose.model import StageEpoch
from lightning_perf.diagnose.registry import RULES
from lightning_perf.diagnose.rules_unstable import CADENCE_MIN_EXCESS
from lightning_perf.diagnose.thresholds import Thresholds
from summaries import epoch


def steps(n: int, base: float = 0.01, stalls: dict[int, float] | None = None, jitter: float = 0.0, seed: int = 0):
    """``n`` step times of ``base`` seconds (times a normal jitter of relative ``jitter``), plus ``stalls``."""
    rng = random.Random(seed)
    return tuple(base * (1 + rng.gauss(0, jitter)) + (stalls or {}).get(i, 0.0) for i in range(n))


def unstable(step_times):
    return RULES["step_time_unstable"](StageEpoch(epoch=epoch(), step_times=step_times), Thresholds())


# A busy machine's stalls read "stalls every 2 batches" (nothing in the program was periodic): two stalls a cycle of
# 8 in the first 32 batches, then stray ones.
NOISE = dict.fromkeys((1, 3, 9, 11, 17, 19, 25, 29, 35, 38, 44, 53, 58, 61), 0.03)


@pytest.mark.parametrize("n", [32, 64])
def test_stalls_of_a_busy_machine_name_no_cadence(n):
    series = steps(n, stalls=NOISE)
    assert cadence(series, CADENCE_MIN_EXCESS) is None
    f = unstable(series)
    assert f is not None and "every" not in f.title, f


def test_random_stalls_never_make_a_cadence():
    # A predict loop with nothing periodic read "every 4 batches". Random stalls at 5-45% of the steps, 32-200
    # batches, with and without jitter: 270 series, none with a cadence.
    claimed = []
    for n in (32, 96, 200):
        for q in (0.05, 0.2, 0.45):
            for jitter in (0.0, 0.1, 0.3):
                for seed in range(10):
                    rng = random.Random(seed)
                    stalls = {i: rng.uniform(0.005, 0.03) for i in range(n) if rng.random() < q}
                    if (
                        found := cadence(steps(n, stalls=stalls, jitter=jitter, seed=seed), CADENCE_MIN_EXCESS)
                    ) is not None:
                        claimed.append((n, q, jitter, seed, found.every))
    assert claimed == []


def test_a_stall_under_the_spread_is_found_by_its_position():
    # A `training_step` sleeping 60 ms every 10th batch of 150-ms steps: 1.4x the median, no spike, no spread; the
    # 10th position's median is 60 ms above the others' in every cycle.
    series = steps(100, base=0.150, stalls=dict.fromkeys(range(9, 100, 10), 0.06), jitter=0.05, seed=3)
    found = cadence(series, CADENCE_MIN_EXCESS)
    assert (found.every, found.indices[:3], found.held, found.cycles) == (10, (9, 19, 29), 10, 10)
    f = unstable(series)
    assert f.title == "Training stalls every 10 batches" and f.severity == "warning"
    assert "every 10 batches (at batches 9, 19, 29, 39, 49, 59, 69, 79, ...) a step 6" in f.evidence
    assert "in 10 of 10 cycles" in f.evidence and "Something runs every 10 batches" in f.advice


def test_the_period_is_the_shortest_that_holds_not_a_multiple_or_a_divisor():
    every8 = steps(96, stalls=dict.fromkeys(range(7, 96, 8), 0.02))
    assert cadence(every8, CADENCE_MIN_EXCESS).every == 8
    # Two stalls of a size every 8 batches (at 1 and 5): a cadence of 4, not two of 8.
    twice = steps(96, stalls={i: 0.02 for i in range(96) if i % 8 in (1, 5)})
    assert cadence(twice, CADENCE_MIN_EXCESS).every == 4
    # Two stalls of a size at 1 and 3 of every 8: no position holds the cycle's stalls.
    pair = steps(96, stalls={i: 0.02 for i in range(96) if i % 8 in (1, 3)})
    assert cadence(pair, CADENCE_MIN_EXCESS) is None


def test_a_cadence_holds_across_the_epoch_not_in_one_stretch():
    # Stalls every 8 batches in the first 40 of 200: no cycle of the epoch's, a stretch.
    assert cadence(steps(200, stalls=dict.fromkeys((7, 15, 23, 31, 39), 0.04)), CADENCE_MIN_EXCESS) is None
    # One cycle in five may miss it (a busy moment), and a stray stall beside it does not hide it.
    missed = {i: 0.04 for i in range(7, 80, 8) if i != 31} | {26: 0.04}
    assert cadence(steps(80, stalls=missed), CADENCE_MIN_EXCESS).every == 8
    two_missed = {i: 0.04 for i in range(7, 40, 8) if i not in (15, 31)}
    assert cadence(steps(40, stalls=two_missed), CADENCE_MIN_EXCESS) is None
