"""
Step-time stability
===================

Whether a stage's steps are steady: ``step_time_unstable``, from every batch's step time (the always-on clocks),
and the period of its stalls when they recur.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Collection, Sequence

from lightning_perf.diagnose.model import Finding, StageEpoch
from lightning_perf.diagnose.rule_helpers import batch_end_hook, finding, on_cuda, reaches, stage_name, step_method
from lightning_perf.diagnose.rules_compile import compile_steps
from lightning_perf.diagnose.thresholds import Thresholds
from lightning_perf.units import ms, percent, times

# Lightning's default `Trainer(log_every_n_steps=...)`: spikes with this period are most likely logging.
LIGHTNING_LOG_EVERY_N_STEPS = 50
# Spikes are called periodic when at least half of them fall on one period (our judgment: one stray stall
# should not hide a periodic one, nor should a coincidence of two make a period).
REGULAR_SHARE = 0.5


def spikes(step_times: Sequence[float], factor: float, min_excess: float = 0.0) -> tuple[list[int], float]:
    """Indices of the steps at least ``factor`` times the median and at least ``min_excess`` seconds above it
    (the first step, a warm-up, left out), and the median. Steps that are not finite (NaN: a batch the profiler
    slowed down) are ignored."""
    measured = [s for s in step_times if math.isfinite(s)]
    if len(measured) < 2:
        return [], 0.0
    median = statistics.median(measured)
    if median <= 0:
        return [], median
    return [
        i
        for i, s in enumerate(step_times)
        if i > 0 and math.isfinite(s) and reaches(s / median, factor) and reaches(s - median, min_excess)
    ], median


# A cadence is claimed only from this many repeats (slots of the period with a spike): three spikes spaced alike
# (two gaps) are a coincidence among a busy machine's random stalls too often (a `test_step` with nothing
# periodic was said to stall "every 4 batches"); four (three equal gaps) is our judgment.
PERIOD_REPEATS = 4
# The fewest measured batches a p90 is judged from: of fewer, the p90 (interpolated between ranks) is the slowest
# step or most of it. Lightning's bug_report_model over 200 epochs of 4 batches was "unstable: p90 1.5x the
# median" in 18 epochs: each time its slowest step, the epoch's first (the loop's start). Not pooled across
# epochs: their percentiles tell no p90 of their batches. Our judgment (a tenth of 10 is one step).
SPREAD_MIN_STEPS = 10
# A stall on a cadence is the program's (a checkpoint, a logger's write, a callback every N batches), however short:
# its floor is 1 ms, the one the irregular stalls and the spread had before a scheduler slice (Thresholds,
# `step_min_spike`). Lightning's BoringModel with `ModelCheckpoint(every_n_train_steps=8)`, 1.1-ms steps, stalled
# 2-3.7 ms at each save: 30% of its time, under a slice. Cadences from 4 batches on: one of 2 or 3 is gradient
# accumulation's optimizer step, or random stalls dense enough to fill every other slot (a busy machine).
CADENCE_MIN_EXCESS = 1e-3
CADENCE_MIN_PERIOD = 4
# ... and exactly on it: three quarters of the slow steps, filling three quarters of its slots. :func:`period`'s
# looser test (half, within a batch) found "every 12 batches" in 12 slow steps at random batches of 96.
CADENCE_SHARE = 0.75


def period(indices: Sequence[int]) -> tuple[int, list[int]] | None:
    """The period of the regular part of ``indices``, and the indices on it; ``None`` when none is regular.

    Notes:
        1. The period is the gap between consecutive indices that most other gaps are within one of (a
           one-off stall between two periodic ones splits a gap but leaves the others); of several, the most
           common one.
        2. The indices on it are those in the most common residue class modulo the period (within one batch
           either way for periods of 10 or more, which absorbs a cadence counted in optimizer steps).
        3. Regular: at least ``PERIOD_REPEATS`` distinct slots of the period on it (indices within the slack
           of one slot, a burst, count once: a burst at batches 2, 3 and one more spike at 18 is no period of
           15), at least ``REGULAR_SHARE`` of all indices, and filling at least ``REGULAR_SHARE`` of the period's
           slots between the first and the last of them (indices that merely share a residue of a short period,
           far apart, are a coincidence).
    """
    gaps = [b - a for a, b in itertools.pairwise(indices) if b - a >= 2]
    if len(indices) < 3 or not gaps:
        return None
    # Of the gaps most others are within one of, the most common: a stray spike one batch before a periodic
    # one leaves a gap of period - 1, which all the others are within one of too.
    every = max(sorted(gaps), key=lambda g: (sum(abs(other - g) <= 1 for other in gaps), gaps.count(g)))
    slack = 1 if every >= 10 else 0

    def near(i: int, residue: int) -> bool:
        distance = abs(i % every - residue)
        return min(distance, every - distance) <= slack

    residue = max(range(every), key=lambda r: sum(near(i, r) for i in indices))
    on = [i for i in indices if near(i, residue)]
    slots = round((on[-1] - on[0]) / every) + 1 if on else 0
    repeats = len({round((i - on[0]) / every) for i in on})
    if repeats < PERIOD_REPEATS or len(on) < REGULAR_SHARE * len(indices) or repeats < REGULAR_SHARE * slots:
        return None
    return every, on


def measured_steps(ctx: StageEpoch, compiled: Collection[int] | None = None) -> tuple[float, ...]:
    """The epoch's step times, NaN for the batches during which ``torch.compile`` compiled (Notes 3;
    ``compiled``: :func:`compile_steps`, where the caller has them)."""
    compiled = compile_steps(ctx) if compiled is None else compiled
    return tuple(math.nan if i in compiled else s for i, s in enumerate(ctx.step_times)) if compiled else ctx.step_times


def slow_cadence(ctx: StageEpoch, t: Thresholds, steps: Sequence[float] | None = None) -> tuple[int, list[int]] | None:
    """The :func:`_cadence` of the epoch's measured steps (``steps``, where the caller has them:
    :func:`measured_steps`) ``step_p90_p50`` times the median and :data:`CADENCE_MIN_EXCESS` above it: slow steps
    the program makes every N batches."""
    steps = measured_steps(ctx) if steps is None else steps
    return _cadence(spikes(steps, t.step_p90_p50, CADENCE_MIN_EXCESS)[0])


def _shown(indices: Sequence[int]) -> str:
    """Batch indices for evidence: the first 8, then "..."."""
    return ", ".join(str(i) for i in indices[:8]) + (", ..." if len(indices) > 8 else "")


def _cadence(indices: Sequence[int]) -> tuple[int, list[int]] | None:
    """The period ``indices`` fall on exactly (:data:`CADENCE_MIN_PERIOD` batches or more, :data:`CADENCE_SHARE` of
    them, filling that share of its slots), and the indices on it; ``None`` where there is none."""
    found = period(indices)
    if found is None or found[0] < CADENCE_MIN_PERIOD:
        return None
    every, on = found
    exact = [i for i in on if (i - on[0]) % every == 0]
    slots = (exact[-1] - exact[0]) // every + 1
    if len(exact) < CADENCE_SHARE * len(indices) or len(exact) < CADENCE_SHARE * slots:
        return None
    return every, exact


def _p50_p90(values: Sequence[float]) -> tuple[float, float]:
    """The median and p90 of ``values`` (not empty), interpolated linearly between ranks as the epoch's own
    percentiles are (:func:`lightning_perf.summarize.steps.percentile`, numpy's default)."""
    if len(values) < 2:
        return values[0], values[0]
    return statistics.median(values), statistics.quantiles(values, n=10, method="inclusive")[-1]


def step_time_unstable(ctx: StageEpoch, t: Thresholds) -> Finding | None:
    """Step times vary a lot, or spike again and again.

    Notes:
        1. Spread: the epoch's p90 / p50 step time, from every batch; it counts when it reaches
           ``step_p90_p50`` and p90 - p50 reaches ``step_min_spread``, in an epoch of at least
           :data:`SPREAD_MIN_STEPS` measured batches (a p90 of fewer is its slowest step, whatever the spread).
        2. Spikes: steps at least ``step_spike_factor`` times the median step and ``step_min_spike`` above it
           (the first step left out); and their period, when most of them are regularly spaced (:func:`period`).
        3. Batches during which ``torch.compile`` compiled (``StageEpoch.compile.steps``) are left out of
           both: the percentiles are taken over the other batches' step times, and compile steps that
           would have been spikes are named as such in the evidence. A compiled run whose only slow steps
           are its compiles is steady.
        4. Fires, as a warning, on the spread or on ``step_spike_count`` spikes or more; advice follows the
           period (e.g. every 50 training batches: Lightning's default ``log_every_n_steps``), the stage and the
           device.
        5. The spread's and the spikes' floors are a scheduler slice (``step_min_spread``, ``step_min_spike``),
           or :data:`CADENCE_MIN_EXCESS` where the slow steps (``step_p90_p50`` times the median and that much
           above it) fall on a cadence (:func:`_cadence`): the program's, which the title and advice then name.
    """
    epoch = ctx.epoch
    p50, p90 = epoch.step_time_p50, epoch.step_time_p90
    compiled = compile_steps(ctx)
    step_times = measured_steps(ctx, compiled)
    if step_times:  # the epoch's own batches (a trace's context has none: its steps' mean only)
        kept = [s for s in step_times if math.isfinite(s)]
        p50, p90 = _p50_p90(kept) if len(kept) >= SPREAD_MIN_STEPS else (0.0, 0.0)
    ratio = p90 / p50 if p50 > 0 else None
    rhythm = slow_cadence(ctx, t, step_times)
    min_spread, min_spike = (CADENCE_MIN_EXCESS,) * 2 if rhythm else (t.step_min_spread, t.step_min_spike)
    found, median = spikes(step_times, t.step_spike_factor, min_spike)
    spread = ratio is not None and reaches(ratio, t.step_p90_p50) and reaches(p90 - p50, min_spread)
    spiky = len(found) >= t.step_spike_count
    if not (spread or spiky):
        return None
    evidence = []
    if ratio is not None:
        evidence.append(
            f"p90 step {ms(p90)} is {times(ratio)} the median {ms(p50)}"
            + (" (compile steps left out)" if compiled else "")
            + f" (warning >= {t.step_p90_p50:g}x and >= {ms(min_spread)} above it)"
        )
    regular = period(found)
    every = regular[0] if spiky and regular else rhythm[0] if rhythm else None
    if rhythm and not (spiky and regular):  # the slow steps' own cadence, where the spikes tell none
        evidence.append(
            f"{len(rhythm[1])} steps >= {t.step_p90_p50:g}x the median every {every} batches, at batches"
            f" {_shown(rhythm[1])}"
            f" (a cadence: from {ms(CADENCE_MIN_EXCESS)} above the median, not a scheduler slice)"
        )
    if found:
        if regular is None:
            periodic = ""
        elif len(regular[1]) == len(found):
            periodic = f" (every {every} batches)"
        else:
            periodic = f" ({len(regular[1])} of them every {every} batches)"
        evidence.append(
            f"{len(found)} step{'s' if len(found) > 1 else ''} >= {t.step_spike_factor:g}x the median"
            f" {ms(median)} at batches {_shown(found)}{periodic} (warning >= {t.step_spike_count} spikes, each"
            f" >= {ms(min_spike)} above the median)"
        )
    if slow_compiles := [
        i
        for i in sorted(compiled)
        if i < len(ctx.step_times)
        and median > 0
        and reaches(ctx.step_times[i] / median, t.step_spike_factor)
        and reaches(ctx.step_times[i] - median, min_spike)
    ]:
        many = "es" if len(slow_compiles) > 1 else ""
        evidence.append(f"batch{many} {_shown(slow_compiles)} compiled (torch.compile): left out")
    if every:
        advice = [_periodic_advice(ctx, every)]
    elif spiky:
        advice = [_irregular_advice(ctx)]
    else:
        advice = [_spread_advice(ctx, ratio or 0.0, t)]
    title = (
        f"{stage_name(ctx.stage)} stalls every {every} batches"
        if every
        else f"{stage_name(ctx.stage)} step time unstable: p90 {times(ratio)} the median"
        if spread and ratio
        else f"{stage_name(ctx.stage)} step time spikes {len(found)} times"
    )
    return finding(ctx, "step_time_unstable", "warning", title, evidence, advice)


_GC = "Python's garbage collector also runs on a cadence (`gc.freeze()` after setup makes its passes cheaper)"


def _periodic_advice(ctx: StageEpoch, every: int) -> str:
    """What runs every ``every`` batches, in this stage."""
    if ctx.stage == "train":
        likely = (
            f" ({every} is Lightning's default `log_every_n_steps`: most likely logging)"
            if every == LIGHTNING_LOG_EVERY_N_STEPS
            else ""
        )
        syncs = "`.item()` syncs, " if on_cuda(ctx) else ""
        return (
            f"Something runs every {every} batches{likely}: logging ({syncs}logger writes: raise"
            " `Trainer(log_every_n_steps=...)`), checkpointing (`ModelCheckpoint(every_n_train_steps=...)`), a"
            f" `val_check_interval`, or a callback on a step count; {_GC}."
        )
    return (
        f"Something runs every {every} batches: a callback or hook counting batches"
        f" (`{batch_end_hook(ctx.stage)}`), or code in `{step_method(ctx.stage)}` that runs on some batches only"
        f" (image or sample logging, a metric computed every N batches); {_GC}."
    )


def _irregular_advice(ctx: StageEpoch) -> str:
    """Causes of stalls with no period, for this run's device and DataLoader."""
    workers = ctx.facts.num_workers
    loader = (
        "slow items read in the step's own process (`num_workers=0`)"
        if workers == 0
        else "DataLoader workers falling behind now and then (a larger `prefetch_factor` queues more batches)"
    )
    shapes = (
        "recompiles with `torch.compile`, cuDNN autotuning with `Trainer(benchmark=True)`"
        if on_cuda(ctx)
        else "recompiles with `torch.compile`"
    )
    return (
        "Irregular stalls: garbage collection (`gc.freeze()` after setup), other processes on the machine,"
        f" {loader}, slow disk or network reads, or new input shapes ({shapes})."
    )


def _spread_advice(ctx: StageEpoch, ratio: float, t: Thresholds) -> str:
    """Causes of a wide spread without repeated spikes, for this stage; an uneven data wait only where the epoch
    waited for data enough for ``dataloader_bound`` to measure it."""
    some = (
        "logging every `log_every_n_steps`, gradient accumulation boundaries"
        if ctx.stage == "train"
        else f"a hook or logging in `{step_method(ctx.stage)}` on some batches only"
    )
    wait = ctx.epoch.data_wait_fraction
    uneven = (
        f" an uneven data wait (data wait is {percent(wait)} of this epoch: `dataloader_bound`),"
        if reaches(wait, t.dataloader_warning)
        else ""
    )
    return (
        f"The slowest tenth of the steps take {times(ratio)} the median:{uneven} work on some steps only ({some}),"
        " or, where the batches' shapes vary (sequences, images of several sizes), the larger ones (bucket batches"
        " by length, pad to fixed sizes)."
    )
