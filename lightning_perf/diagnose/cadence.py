"""
Step-time cadence
=================

Whether an epoch's slow steps come every N batches: a checkpoint, a logger's write, a metric computed on some
batches only. A cadence is found by the position in the cycle, not by the spread: the step times are grouped by
their batch index modulo the period, and one position must stand out from the others in (nearly) every cycle.

Two kinds of error this guards against, both seen on real runs:

- A cadence named from noise. A busy machine's stalls at batches 1, 3, 9, 11, 17, 19, 25, 29 read "stalls every 2
  batches" when the rule looked at the gaps between slow steps, and a predict loop with nothing periodic read
  "every 4 batches". Here each cycle must hold most of its excess at the one position: two stalls a cycle, or a
  stall at that position in only some cycles, make no cadence.
- A real cadence missed. A `training_step` that slept 60 ms every 10th batch of 150-ms steps was never a spike
  (1.5x the median), yet the 10th position's median is 60 ms above the others' in every cycle.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

# A cadence is claimed from this many cycles: three slow steps spaced alike are a coincidence among a busy
# machine's random stalls too often (a `test_step` with nothing periodic was said to stall "every 4 batches");
# four is our judgment.
CADENCE_MIN_CYCLES = 4
# Periods from 4 batches: one of 2 or 3 is gradient accumulation's optimizer step (by design), or random stalls
# dense enough to fill every other slot (a busy machine). Our judgment, as before.
CADENCE_MIN_PERIOD = 4
# The longest period searched: Lightning's default `log_every_n_steps` (50) and a checkpoint or a metric every
# 100-200 batches fit; longer ones need epochs of 1,000 batches or more to show four cycles, and the search costs
# the epoch's batches times the periods (our judgment).
CADENCE_MAX_PERIOD = 200
# A cycle holds the cadence when its step at the position is at least half the cadence's excess above the other
# positions' median: in every cycle but one in five ("nearly every cycle": a busy moment hides one).
CYCLE_MISSES = 5
# ... and the position's slow steps carry at least this share of the time all the epoch's steps that slow spend
# above the others' median: stalls at batches 1 and 3 of every 8 are no cadence at 1, nor is a position of a
# busy machine's dense random stalls. Our judgment: more than half, with room for a busy moment's stalls.
POSITION_SHARE = 0.6
# ... and three quarters of it over fewer cycles than this: in 2,700 series of 32-64 batches of random stalls on
# 20-45% of the steps, the share of 0.6 alone named 9 cadences; 0.75 under 6 cycles, 3, all in one series whose
# every 5th step stalled (benchmarks/cadence_noise.py's series). Our judgment.
FEW_CYCLES = 6
FEW_CYCLES_SHARE = 0.75
# ... or, from this many cycles, at least STANDOUT times any other single position's: a busy machine's random
# stalls spread over the other positions, however many there are. Random stalls in 3,600 series of 32-200 batches
# (5-45% of the steps, with and without jitter) made 3 cadences with it, that same series, as with the share alone;
# a 60-ms stall every 10th of 80 steps of 130 ms, beside random delays of up to 50 ms on 5-50% of the steps and
# 10-100 ms on 3%, was found in 55-60 of 60 series with it, 19-53 without (benchmarks/cadence_noise.py). Our
# judgment.
RANK_CYCLES = 8
STANDOUT = 2.5
# The position's excess must stand out of the other positions' jitter: at least this many times their spread
# (1.4826 times the median absolute deviation: a normal law's standard deviation). Our judgment: two standard
# deviations leave a 2% chance a step passes by jitter alone, and every cycle must then pass.
NOISE_SPREADS = 2.0
MAD_TO_SD = 1.4826


@dataclass(frozen=True, kw_only=True)
class Cadence:
    """Slow steps every ``every`` batches.

    Attributes:
        every: The period, in batches.
        indices: The batches at the cycle's slow position (those measured), in order.
        held: Of them, the cycles that held it (at least half the excess above the others' median).
        excess: The position's median step less the other positions' median (seconds).
        base: The other positions' median step (seconds).
    """

    every: int
    indices: tuple[int, ...]
    held: int
    excess: float
    base: float

    @property
    def cycles(self) -> int:
        """The cycles measured at the position."""
        return len(self.indices)

    @property
    def lost(self) -> float:
        """The time the cadence adds to the epoch: its excess in every cycle (seconds)."""
        return self.excess * self.cycles


def cadence(step_times: Sequence[float], min_excess: float) -> Cadence | None:
    """The shortest period whose one position is slow in (nearly) every cycle, by at least ``min_excess`` seconds.

    Args:
        step_times: The epoch's step times in batch order; NaN for a batch not measured (a window's, a compile).
            The first step, a warm-up, is left out.
        min_excess: The least excess over the other positions' median that names a cadence (seconds).

    Notes:
        1. For each period ``p`` from :data:`CADENCE_MIN_PERIOD` to :data:`CADENCE_MAX_PERIOD` with at least
           :data:`CADENCE_MIN_CYCLES` cycles, and each position ``r`` in the cycle: the steps at ``i % p == r``
           against all the others. Its excess is the median of the first less the median of the others.
        2. The excess must reach ``min_excess`` and :data:`NOISE_SPREADS` times the others' spread.
        3. A cycle holds when its step at ``r`` is at least half the excess above the others' median; every cycle
           must hold but one in :data:`CYCLE_MISSES`.
        4. The position's slow steps carry :data:`POSITION_SHARE` of the time the epoch's steps that slow spend
           above the others' median (:data:`FEW_CYCLES_SHARE` over fewer than :data:`FEW_CYCLES` cycles), or, over
           :data:`RANK_CYCLES` cycles or more, :data:`STANDOUT` times any other position's: one stall at the
           position, not one of several a cycle, nor one of a busy machine's many.
        5. Of several, the shortest period (a multiple holds two stalls a cycle and fails Note 4), then the
           largest excess.
    """
    measured = [(i, s) for i, s in enumerate(step_times) if i > 0 and math.isfinite(s)]
    if len(measured) < CADENCE_MIN_CYCLES * CADENCE_MIN_PERIOD:
        return None
    values = [s for _, s in measured]
    median = statistics.median(values)
    spread = MAD_TO_SD * statistics.median(abs(s - median) for s in values)
    # Only a position slow in most cycles can hold: positions are screened by the steps above the epoch's median
    # by the least excess (its steps are the position's own, and a cadence moves the median little).
    hot = [i for i, s in measured if s - median >= max(min_excess, NOISE_SPREADS * spread) / 2]
    last = len(step_times)
    for p in range(CADENCE_MIN_PERIOD, min(CADENCE_MAX_PERIOD, last // CADENCE_MIN_CYCLES) + 1):
        needed = _needed((last - 1) // p)
        if len(hot) < needed:  # no position can hold: fewer slow steps than the cycles that must hold
            continue
        # The slow steps by position, counted in C (`i % p` by map): the search runs at every epoch's end, over
        # periods times slow steps (28 -> 23 ms for an epoch of 3,072 steps, 45% of them slow).
        counts = Counter(map(p.__rmod__, hot))
        found = [c for r, n in counts.items() if n >= needed and (c := _at(step_times, p, r, min_excess)) is not None]
        if found:
            return max(found, key=lambda c: c.excess)
    return None


def _needed(cycles: int) -> int:
    """The cycles that must hold of ``cycles``."""
    return cycles - cycles // CYCLE_MISSES


def _at(step_times: Sequence[float], p: int, r: int, min_excess: float) -> Cadence | None:
    """The cadence at position ``r`` of period ``p``, where it holds (:func:`cadence`'s Notes 1-4)."""
    on = [(i, s) for i, s in enumerate(step_times) if i > 0 and i % p == r and math.isfinite(s)]
    others = [s for i, s in enumerate(step_times) if i > 0 and i % p != r and math.isfinite(s)]
    if len(on) < CADENCE_MIN_CYCLES or not others:
        return None
    base = statistics.median(others)
    spread = MAD_TO_SD * statistics.median(abs(s - base) for s in others)
    excess = statistics.median(s for _, s in on) - base
    if excess < max(min_excess, NOISE_SPREADS * spread) or excess <= 0:
        return None
    slow = [s - base for _, s in on if s - base >= excess / 2]
    if len(slow) < _needed(len(on)):
        return None
    # Its slow steps carry most of the time the epoch's steps that slow spend above the others' median, or, over
    # many cycles, STANDOUT times any other position's: no stall elsewhere as often.
    mine = sum(slow)
    elsewhere = _slow_time(step_times, p, r, base, excess / 2)
    share = POSITION_SHARE if len(on) >= FEW_CYCLES else FEW_CYCLES_SHARE
    if mine < share * (mine + sum(elsewhere)) and (
        len(on) < RANK_CYCLES or mine < STANDOUT * max(elsewhere, default=0.0)
    ):
        return None
    held = len(slow)
    return Cadence(every=p, indices=tuple(i for i, _ in on), held=held, excess=excess, base=base)


def _slow_time(step_times: Sequence[float], p: int, r: int, base: float, least: float) -> list[float]:
    """At each position of period ``p`` but ``r``: the time its steps ``least`` or more above ``base`` spend above
    it (seconds)."""
    by: dict[int, float] = {}
    for i, s in enumerate(step_times):
        if i > 0 and i % p != r and s - base >= least:  # NaN compares false
            by[i % p] = by.get(i % p, 0.0) + s - base
    return list(by.values())
