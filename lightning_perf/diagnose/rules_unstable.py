"""
Step-time stability
===================

Whether a stage's steps are steady: ``step_time_unstable``, from every batch's step time (the always-on clocks),
and the period of its stalls when they recur.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection, Sequence

from lightning_perf.diagnose.cadence import Cadence, cadence
from lightning_perf.diagnose.model import Finding, Severity, StageEpoch
from lightning_perf.diagnose.rule_helpers import (
    batch_end_hook,
    epoch_start_hook,
    finding,
    on_cuda,
    reaches,
    stage_name,
    step_method,
)
from lightning_perf.diagnose.rules_compile import compile_steps
from lightning_perf.diagnose.thresholds import Thresholds
from lightning_perf.units import limit, ms, percent, times

# Lightning's default `Trainer(log_every_n_steps=...)`: spikes with this period are most likely logging.
LIGHTNING_LOG_EVERY_N_STEPS = 50


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


# The fewest measured batches a p90 is judged from: of fewer, the p90 (interpolated between ranks) is the slowest
# step or most of it. Lightning's bug_report_model over 200 epochs of 4 batches was "unstable: p90 1.5x the
# median" in 18 epochs: each time its slowest step, the epoch's first (the loop's start). Not pooled across
# epochs: their percentiles tell no p90 of their batches. Our judgment (a tenth of 10 is one step).
SPREAD_MIN_STEPS = 10
# A stall on a cadence is the program's (a checkpoint, a logger's write, a callback every N batches), however short:
# its floor is 1 ms, the one the irregular stalls and the spread had before a scheduler slice (Thresholds,
# `step_min_spike`). Lightning's BoringModel with `ModelCheckpoint(every_n_train_steps=8)`, 1.1-ms steps, stalled
# 2-3.7 ms at each save: 30% of its time, under a slice.
CADENCE_MIN_EXCESS = 1e-3
# ... and it is named where it adds this share of the epoch's step time or more (its excess in every cycle): a
# `training_step` sleeping 60 ms every 10th batch of 150-ms steps adds 4%, worth naming since its cause is one
# line of the program; 1 ms every 50 batches of 100-ms steps (0.02%) is not. Our judgment.
CADENCE_MIN_SHARE = 0.02
# Slow steps off a cadence (the spread, or spikes) warn only where they take this share of the epoch's step time
# beyond the median, and are spread over it: in at least PERSIST_PARTS of its EPOCH_PARTS stretches (quarters),
# none holding more than half of that time. A freshly booted 2-CPU VM, idle, gave clean runs "p90 2.19x the median"
# (32 steps of 4 ms) and "p90 1.57x": a few steps a scheduler slice late, or a burst of the host taking the vCPU
# (steal time, which no run-queue wait sees). Where the slow steps are fewer or bunched, the finding is information. Our
# judgment: a twentieth of the epoch, in three quarters of it.
UNSTABLE_MIN_SHARE = 0.05
EPOCH_PARTS = 4
PERSIST_PARTS = 3


def measured_steps(ctx: StageEpoch, compiled: Collection[int] | None = None) -> tuple[float, ...]:
    """The epoch's step times, NaN for the batches during which ``torch.compile`` compiled (Notes 3;
    ``compiled``: :func:`compile_steps`, where the caller has them)."""
    compiled = compile_steps(ctx) if compiled is None else compiled
    return tuple(math.nan if i in compiled else s for i, s in enumerate(ctx.step_times)) if compiled else ctx.step_times


def program_cadence(ctx: StageEpoch, steps: Sequence[float] | None = None) -> Cadence | None:
    """The :func:`~lightning_perf.diagnose.cadence.cadence` of the epoch's measured steps (``steps``, where the
    caller has them: :func:`measured_steps`), from :data:`CADENCE_MIN_EXCESS`, where it adds
    :data:`CADENCE_MIN_SHARE` of the epoch's step time: slow steps the program makes every N batches."""
    steps = measured_steps(ctx) if steps is None else steps
    found = cadence(steps, CADENCE_MIN_EXCESS)
    total = sum(s for s in steps if math.isfinite(s))
    return found if found is not None and total > 0 and reaches(found.lost / total, CADENCE_MIN_SHARE) else None


def slow_cadence(ctx: StageEpoch, t: Thresholds, steps: Sequence[float] | None = None) -> tuple[int, list[int]] | None:
    """The period and batches of :func:`program_cadence`, or ``None``; ``t`` is unused (kept for callers)."""
    found = program_cadence(ctx, steps)
    return (found.every, list(found.indices)) if found is not None else None


def _shown(indices: Sequence[int]) -> str:
    """Batch indices for evidence: the first 8, then "..."."""
    return ", ".join(str(i) for i in indices[:8]) + (", ..." if len(indices) > 8 else "")


def scattered(steps: Sequence[float], p50: float, t: Thresholds) -> str | None:
    """Why slow steps off a cadence are no warning (:data:`UNSTABLE_MIN_SHARE`, :data:`PERSIST_PARTS`), for the
    evidence; ``None`` where they are one: a material share of the epoch, spread over it."""
    finite = [(i, s) for i, s in enumerate(steps) if i > 0 and math.isfinite(s)]
    total = sum(s for _, s in finite)
    if not finite or total <= 0 or p50 <= 0:
        return None
    n = len(steps)
    parts = [0.0] * EPOCH_PARTS
    for i, s in finite:
        if reaches(s / p50, t.step_p90_p50) and reaches(s - p50, t.step_min_spread):
            parts[min(EPOCH_PARTS - 1, i * EPOCH_PARTS // n)] += s - p50
    lost = sum(parts)
    if not reaches(lost / total, UNSTABLE_MIN_SHARE):
        return (
            f"the slow steps (>= {t.step_p90_p50:g}x the median and {ms(t.step_min_spread)} above it) took"
            f" {percent(lost / total)} of the epoch beyond the median (warning >= {limit(UNSTABLE_MIN_SHARE)}):"
            " scheduling noise as likely (a busy machine, or a virtual machine's host taking the CPU)"
        )
    spread_over = sum(part > 0 for part in parts)
    if spread_over < PERSIST_PARTS or max(parts) > lost / 2:
        return (
            f"the slow steps' time beyond the median is bunched: {percent(max(parts) / lost)} of it in one quarter"
            f" of the epoch, in {spread_over} of its {EPOCH_PARTS} quarters (warning: in >= {PERSIST_PARTS}, none"
            " holding more than half): one burst, as a busy machine or a virtual machine's host makes"
        )
    return None


def _p50_p90(values: Sequence[float]) -> tuple[float, float]:
    """The median and p90 of ``values`` (not empty), interpolated linearly between ranks as the epoch's own
    percentiles are (:func:`lightning_perf.summarize.steps.percentile`, numpy's default)."""
    if len(values) < 2:
        return values[0], values[0]
    return statistics.median(values), statistics.quantiles(values, n=10, method="inclusive")[-1]


def step_time_unstable(ctx: StageEpoch, t: Thresholds) -> Finding | None:
    """Step times vary a lot, or spike again and again.

    Notes:
        1. Cadence: slow steps at one position of a cycle of N batches, in (nearly) every cycle
           (:func:`~lightning_perf.diagnose.cadence.cadence`), from :data:`CADENCE_MIN_EXCESS` above the other
           positions' median and adding :data:`CADENCE_MIN_SHARE` of the epoch: the program's (a checkpoint, a
           logger, a metric every N batches). The title and the advice name the period; a warning.
        2. Spread: the epoch's p90 / p50 step time, from every batch; it counts when it reaches
           ``step_p90_p50`` and p90 - p50 reaches ``step_min_spread``, in an epoch of at least
           :data:`SPREAD_MIN_STEPS` measured batches (a p90 of fewer is its slowest step, whatever the spread).
        3. Spikes: steps at least ``step_spike_factor`` times the median step and ``step_min_spike`` above it
           (the first step left out); ``step_spike_count`` of them or more count.
        4. Off a cadence, the spread or the spikes warn only where the slow steps take
           :data:`UNSTABLE_MIN_SHARE` of the epoch beyond the median, spread over it (:func:`scattered`); else they
           are information: a scheduler's or a virtual machine host's delays look the same.
        5. Batches during which ``torch.compile`` compiled (``StageEpoch.compile.steps``) are left out of
           all of these, and compile steps that would have been spikes are named as such in the evidence. A
           compiled run whose only slow steps are its compiles is steady.
    """
    epoch = ctx.epoch
    p50, p90 = epoch.step_time_p50, epoch.step_time_p90
    compiled = compile_steps(ctx)
    step_times = measured_steps(ctx, compiled)
    if step_times:  # the epoch's own batches (a trace's context has none: its steps' mean only)
        kept = [s for s in step_times if math.isfinite(s)]
        p50, p90 = _p50_p90(kept) if len(kept) >= SPREAD_MIN_STEPS else (0.0, 0.0)
    ratio = p90 / p50 if p50 > 0 else None
    rhythm = program_cadence(ctx, step_times)
    min_spread, min_spike = (CADENCE_MIN_EXCESS,) * 2 if rhythm else (t.step_min_spread, t.step_min_spike)
    found, median = spikes(step_times, t.step_spike_factor, min_spike)
    spread = ratio is not None and reaches(ratio, t.step_p90_p50) and reaches(p90 - p50, min_spread)
    spiky = len(found) >= t.step_spike_count
    if not (rhythm or spread or spiky):
        return None
    evidence = []
    severity: Severity = "warning"
    if rhythm is None and (why := scattered(step_times, p50 or median, t)) is not None:
        severity = "info"
        evidence.append(why)
    if ratio is not None:
        evidence.append(
            f"p90 step {ms(p90)} is {times(ratio)} the median {ms(p50)}"
            + (" (compile steps left out)" if compiled else "")
            + f" (warning >= {t.step_p90_p50:g}x and >= {ms(min_spread)} above it)"
        )
    if rhythm:
        evidence.append(_cadence_evidence(rhythm))
    if found:
        on = set(rhythm.indices) if rhythm else set()
        periodic = len([i for i in found if i in on])
        suffix = (
            ""
            if not periodic or rhythm is None
            else f" (every {rhythm.every} batches)"
            if periodic == len(found)
            else f" ({periodic} of them every {rhythm.every} batches)"
        )
        evidence.append(
            f"{len(found)} step{'s' if len(found) > 1 else ''} >= {t.step_spike_factor:g}x the median"
            f" {ms(median)} at batches {_shown(found)}{suffix} (warning >= {t.step_spike_count} spikes, each"
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
    per_epoch = epoch_length(ctx, rhythm) if rhythm else None
    if rhythm and per_epoch:
        evidence.append(
            f"each of them an epoch's first batch (the last {ctx.pooled_epochs} epochs of {per_epoch} batches)"
        )
        advice = [_epoch_start_advice(ctx, rhythm, per_epoch)]
    elif rhythm:
        advice = [_periodic_advice(ctx, rhythm.every)]
    elif spiky:
        advice = [_irregular_advice(ctx)]
    else:
        advice = [_spread_advice(ctx, ratio or 0.0, t)]
    title = (
        f"{stage_name(ctx.stage)} stalls at each epoch's first batch"
        if per_epoch
        else f"{stage_name(ctx.stage)} stalls every {rhythm.every} batches"
        if rhythm
        else f"{stage_name(ctx.stage)} step time unstable: p90 {times(ratio)} the median"
        if spread and ratio
        else f"{stage_name(ctx.stage)} step time spikes {len(found)} times"
    )
    return finding(ctx, "step_time_unstable", severity, title, evidence, advice)


def _cadence_evidence(rhythm: Cadence) -> str:
    """The cadence's measurement, as evidence."""
    return (
        f"every {rhythm.every} batches (at batches {_shown(rhythm.indices)}) a step {ms(rhythm.excess)} slower than"
        f" the other batches' median {ms(rhythm.base)}, in {rhythm.held} of {rhythm.cycles} cycles (a cadence: each"
        f" cycle's slow step at the same position, from {ms(CADENCE_MIN_EXCESS)} above the others and"
        f" {limit(CADENCE_MIN_SHARE)} of the epoch)"
    )


_GC = "Python's garbage collector also runs on a cadence (`gc.freeze()` after setup makes its passes cheaper)"


def epoch_length(ctx: StageEpoch, rhythm: Cadence) -> int | None:
    """The batches per epoch where ``rhythm`` is each epoch's first batch: in several short epochs judged together
    (``StageEpoch.pooled_epochs``), each of ``rhythm.every`` batches, the slow ones at each one's start; ``None``
    otherwise. The step times start at an epoch's first batch."""
    epochs = ctx.pooled_epochs
    if epochs <= 1 or ctx.epoch.batches != rhythm.every * epochs:
        return None
    return rhythm.every if all(i % rhythm.every == 0 for i in rhythm.indices) else None


def _epoch_start_advice(ctx: StageEpoch, rhythm: Cadence, per_epoch: int) -> str:
    """What makes each epoch's first batch slow (:func:`epoch_length`): its data wait, where that is most of it."""
    e, epochs = ctx.epoch, ctx.pooled_epochs
    first = e.first_data_wait
    extra = (
        first / epochs - (e.data_wait - first) / (e.batches - epochs)
        if first is not None and e.batches > epochs
        else None
    )
    hook = f"`{epoch_start_hook(ctx.stage)}`"
    if extra is not None and extra >= rhythm.excess / 2:
        return (
            f"Each epoch's first batch waits for data {ms(extra)} longer than the others, and with epochs of"
            f" {per_epoch} batches that is paid every {per_epoch} batches: the DataLoader starting the epoch"
            " (workers start again at every epoch unless `persistent_workers=True`, and even persistent ones begin"
            " it with no batch loaded; an `IterableDataset`'s `__iter__` runs there) or the module's"
            f" {hook}. `dataloader_bound` weighs it with the rest of the wait; fewer, longer epochs pay it less"
            " often."
        )
    return (
        f"Something runs at the start of every epoch, and with epochs of {per_epoch} batches that is paid every"
        f" {per_epoch} batches: {hook} hooks (the module's or a callback's), a learning-rate scheduler stepped"
        f" per epoch, or work on the epoch's first batch in `{step_method(ctx.stage)}`; {_GC}."
    )


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
