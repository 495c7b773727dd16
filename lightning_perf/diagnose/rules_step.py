"""
Training loop rules
===================

Where the step's time goes besides the model's forward and backward: ``optimizer_heavy``,
``validation_heavy``, ``framework_overhead``, and whether it is steady: ``step_time_unstable``.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence

from lightning_perf.diagnose.model import Finding, StageEpoch
from lightning_perf.diagnose.rule_helpers import (
    batch_end_hook,
    epoch_end_hook,
    finding,
    in_window,
    on_cpu,
    on_cpu_share,
    on_cuda,
    reaches,
    stage_name,
    step_method,
    strongest,
)
from lightning_perf.diagnose.rules_compile import compile_steps
from lightning_perf.diagnose.thresholds import Thresholds
from lightning_perf.records import EpochSummary, share
from lightning_perf.units import count, limit, ms, percent, seconds, times

# Lightning's default `Trainer(log_every_n_steps=...)`: spikes with this period are most likely logging.
LIGHTNING_LOG_EVERY_N_STEPS = 50
# Spikes are called periodic when at least half of them fall on one period (our judgment: one stray stall
# should not hide a periodic one, nor should a coincidence of two make a period).
REGULAR_SHARE = 0.5
# What Lightning's bookkeeping takes at each `self.log` call, whatever the cadence it logs at (a clone, a detach,
# device moves and a running mean per value). Measured on the demo's validation (examples/demo.py, 2 values a
# step, 2-CPU machine, 1 torch thread): steps of 1.09 ms, 0.29 ms once the values were summed in the module and
# logged in on_validation_epoch_end; 0.4 ms a value. The trace shows it as Python between `aten::to` calls.
SELF_LOG_COST = 4e-4


def optimizer_heavy(ctx: StageEpoch, t: Thresholds) -> Finding | None:
    """The optimizer's own update (after forward and backward) takes a large share of the training step.

    Notes:
        1. Training only: no other stage steps an optimizer.
        2. Per window: ``optimizer_update_time`` / step time.
        3. Fires, as a warning, at ``optimizer_update`` in the window with the largest share among those whose
           update also takes ``optimizer_min_time`` per step.
        4. Advice names only what would change something: the run's own optimizer class (``RunFacts.optimizer``),
           ``fused=True`` unless it is set already or the class has no fused kernels, and fewer states only for
           Adam-style optimizers; on CUDA ``foreach`` where the trace shows a per-parameter loop. On CPU only
           ``fused`` is advised: ``foreach`` runs the same per-parameter loop there
           (measured with torch 2.13 on one CPU thread, Adam: 400 tensors of 4 floats 30 ms per step looped,
           29 ms foreach, 11 ms fused; 20 tensors of 256x256 9.6, 17 and 5.0 ms).
    """
    if ctx.stage != "train":
        return None
    best = strongest(
        (w for w in ctx.windows if reaches(w.optimizer_update_time, t.optimizer_min_time)),
        lambda w: share(w.optimizer_update_time, w),
    )
    if best is None or not reaches(best[1], t.optimizer_update):
        return None
    window, value = best
    foreach = window.optimizer_foreach
    evidence = [
        f"optimizer update {percent(value)} of the step ({ms(window.optimizer_update_time)} of"
        f" {ms(window.step_time)}, {count(window.optimizer_update_ops)} operators)"
        f" {in_window(window, len(ctx.windows))}"
        f" (warning >= {limit(t.optimizer_update)} and >= {ms(t.optimizer_min_time)} per step)",
        ""
        if foreach is None
        else "multi-tensor (foreach) or fused kernels"
        if foreach
        else "a loop over the parameters (no foreach)",
    ]
    advice = [_optimizer_advice(ctx, foreach)]
    return finding(
        ctx,
        "optimizer_heavy",
        "warning",
        f"Optimizer update takes {percent(value)} of each training step",
        evidence,
        advice,
        window,
    )


def _optimizer_advice(ctx: StageEpoch, foreach: bool | None) -> str:
    """What would make the run's own optimizer's update cheaper: only changes it has not made (its class and
    ``fused`` setting, as configured, and whether the trace shows multi-tensor or fused kernels)."""
    facts = ctx.facts
    name = facts.optimizer or "AdamW"
    states = (
        " Fewer optimizer states shrink its work too: SGD with momentum keeps one per parameter where Adam keeps two,"
        " or an 8-bit optimizer."
        if name in ("Adam", "AdamW")
        else ""
    )
    smaller = (
        " Fewer, larger parameter tensors (e.g. one fused QKV projection instead of three) mean fewer, larger"
        " operations." + states
    )
    if facts.optimizer_fused:
        return (
            f"The update is already fused (`{name}(..., fused=True)`): its time is the fused kernels' own work over"
            " the parameters." + smaller
        )
    if facts.optimizer_fusable is False:
        return f"`{name}` has no fused implementation in torch." + smaller
    fused = f"`torch.optim.{name}(..., fused=True)`"
    if not on_cuda(ctx):
        if foreach:
            return (
                "The update uses `foreach` kernels. On CPU `foreach` runs the same per-parameter loop as the default:"
                f" {fused} updates the parameters in one pass." + smaller
            )
        return (
            f"The update loops over the parameters, a few small operations each: {fused} updates them in one pass;"
            " on CPU `foreach` runs the same loop and does not help." + smaller
        )
    if foreach is False:
        return (
            "The update runs one small kernel per parameter and operation: pass `foreach=True` to the optimizer in"
            f" `configure_optimizers` (e.g. `torch.optim.{name}(..., foreach=True)`), or {fused}, which updates all"
            " parameters in a few kernels."
        )
    return "The update already uses multi-tensor kernels: " + fused + " is faster still." + smaller


def epoch_time(epoch: EpochSummary) -> float:
    """An epoch's step time over all its batches: those left out of ``step_time`` (profiled, FLOP-counted, or
    compiling) counted at the mean of the others."""
    measured = epoch.measured_batches
    return epoch.step_time * epoch.batches / measured if measured > 0 else epoch.step_time


def validation_heavy(ctx: StageEpoch, t: Thresholds) -> Finding | None:
    """Validation takes a large share of a training epoch.

    Notes:
        1. Only for a training epoch with validation runs: the validation step time / (training + validation),
           over the fit so far where known (``StageEpoch.fit_seconds``: validation that runs every N steps across
           one-batch epochs lands in a few epochs, and is a small share of the fit), else over the epoch; each
           epoch over all its batches at the mean of those measured (:func:`epoch_time`).
        3. Advice names the step-based setting (``val_check_interval`` with ``check_val_every_n_epoch=None``)
           where validation runs every N training batches.
        2. Fires, as a warning, at ``validation`` when validation also takes ``validation_min_time`` or more.
    """
    if ctx.stage != "train" or not ctx.validation:
        return None
    facts = ctx.facts
    runs = len(ctx.validation)
    batches = sum(v.batches for v in ctx.validation)
    if ctx.fit_seconds is not None:
        train, val = ctx.fit_seconds
        scope = "the fit so far"
    else:
        val = sum(epoch_time(v) for v in ctx.validation)
        train = epoch_time(ctx.epoch)
        scope = "the epoch"
    total = train + val
    if total <= 0 or not reaches(val / total, t.validation) or not reaches(val, t.validation_min_time):
        return None
    fraction = val / total
    evidence = [
        f"validation {percent(fraction)} of {scope}'s step time ({seconds(val)}, training {seconds(train)});"
        f" this epoch {runs} run{'s' if runs > 1 else ''} of {batches} batches"
        f" (warning >= {limit(t.validation)} and >= {seconds(t.validation_min_time)})"
    ]
    if facts.val_check_steps:
        advice = [
            f"Validation runs every {facts.val_check_steps} training batches"
            " (`Trainer(val_check_interval=..., check_val_every_n_epoch=None)`): a larger `val_check_interval`"
            " validates less often, and `limit_val_batches=0.25` uses a quarter of the validation set. A larger"
            " validation `batch_size` (no gradients or optimizer state need memory) makes each batch cheaper."
        ]
    else:
        advice = [
            "Validate less or faster: `Trainer(limit_val_batches=0.25)` uses a quarter of the validation set,"
            " `check_val_every_n_epoch=N` validates every N epochs"
            + (
                f", and a larger `val_check_interval` runs fewer than the {runs} validations per epoch"
                if runs > 1
                else ""
            )
            + ". A larger validation `batch_size` (no gradients or optimizer state need memory) makes each batch"
            " cheaper; Lightning already runs validation under `torch.inference_mode()`."
        ]
    return finding(
        ctx,
        "validation_heavy",
        "warning",
        f"Validation takes {percent(fraction)} of {'the fit' if ctx.fit_seconds else 'each training epoch'}",
        evidence,
        advice,
    )


def framework_overhead(ctx: StageEpoch, t: Thresholds) -> Finding | None:
    """Much of the step runs no torch operator: the loop's Python, hooks, callbacks, logging.

    Notes:
        1. Per window: ``framework_time`` / step time, both less what waiting for a CPU may hold of them
           (:func:`~lightning_perf.diagnose.rule_helpers.on_cpu`: on a busy machine the wait lands between
           operators, and also dilutes a real overhead over a longer step).
        2. Fires, as a warning, at ``framework_overhead`` in the window with the largest share among those
           whose framework time also reaches ``framework_min_time`` per step.
        3. Advice names the stage's own hook and logging: ``log_every_n_steps`` only paces training's
           logging; in validation and test ``self.log`` logs once per epoch unless ``on_step=True``; predict
           does not log.
    """
    best = strongest(
        (w for w in ctx.windows if reaches(on_cpu(w.framework_time, w)[0], t.framework_min_time)),
        lambda w: on_cpu_share(w.framework_time, w),
    )
    if best is None or not reaches(best[1], t.framework_overhead):
        return None
    window, value = best
    real, step = on_cpu(window.framework_time, window)
    evidence = [
        f"{percent(value)} of the step outside any torch operator ({ms(real)} of {ms(step)})"
        + (
            f" once the {ms(window.step_time - step)} per step waiting for a CPU is left out"
            if step < window.step_time
            else ""
        )
        + f" {in_window(window, len(ctx.windows))} (warning >= {limit(t.framework_overhead)}"
        f" and >= {ms(t.framework_min_time)} per step)"
    ]
    hook = f"a callback or hook (`{batch_end_hook(ctx.stage)}`, ...) doing work every batch"
    progress_bar = "the progress bar (`TQDMProgressBar(refresh_rate=10)` or `enable_progress_bar=False`)"
    per_call = f"bookkeeping runs at every call, about {ms(SELF_LOG_COST)} a value on a 2-CPU machine"
    if ctx.stage == "train":
        parts = [
            hook,
            f"`self.log(...)` of many values in `training_step` (Lightning's {per_call}, whatever"
            " `log_every_n_steps`), above all with `sync_dist=True`",
            progress_bar,
            "logging too often (raise `Trainer(log_every_n_steps=...)`)",
        ]
    elif ctx.stage == "predict":
        parts = [hook + " (a `BasePredictionWriter` writing each batch)", progress_bar]
    else:
        parts = [
            hook,
            f"`self.log(...)` in `{step_method(ctx.stage)}` (Lightning logs there once per epoch, but its"
            f" {per_call}): log fewer values, or sum them in the module (or a torchmetrics `Metric`) and log them"
            f" once in `{epoch_end_hook(ctx.stage)}`; `self.log(..., on_step=True)` and `sync_dist=True` cost more"
            " still",
            progress_bar,
        ]
    advice = [
        f"Look for per-batch work outside the model: {'; '.join(parts)}. Lightning's own loop takes about"
        " 0.3-1 ms of each step (measured on 2-CPU machines), which no setting removes. The gaps between operators in"
        " this window's trace show where the time goes."
    ]
    return finding(
        ctx,
        "framework_overhead",
        "warning",
        f"{stage_name(ctx.stage)} spends {percent(value)} of each step outside torch operators",
        evidence,
        advice,
        window,
    )


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
    """
    epoch = ctx.epoch
    p50, p90 = epoch.step_time_p50, epoch.step_time_p90
    step_times = ctx.step_times
    compiled = compile_steps(ctx)
    if compiled:
        step_times = tuple(math.nan if i in compiled else s for i, s in enumerate(ctx.step_times))
    if step_times:  # the epoch's own batches (a trace's context has none: its steps' mean only)
        kept = [s for s in step_times if math.isfinite(s)]
        p50, p90 = _p50_p90(kept) if len(kept) >= SPREAD_MIN_STEPS else (0.0, 0.0)
    ratio = p90 / p50 if p50 > 0 else None
    found, median = spikes(step_times, t.step_spike_factor, t.step_min_spike)
    spread = ratio is not None and reaches(ratio, t.step_p90_p50) and reaches(p90 - p50, t.step_min_spread)
    spiky = len(found) >= t.step_spike_count
    if not (spread or spiky):
        return None
    evidence = []
    if ratio is not None:
        evidence.append(
            f"p90 step {ms(p90)} is {times(ratio)} the median {ms(p50)}"
            + (" (compile steps left out)" if compiled else "")
            + f" (warning >= {t.step_p90_p50:g}x and >= {ms(t.step_min_spread)} above it)"
        )
    regular = period(found)
    every = regular[0] if regular else None
    if found:
        shown = ", ".join(str(i) for i in found[:8]) + (", ..." if len(found) > 8 else "")
        if regular is None:
            periodic = ""
        elif len(regular[1]) == len(found):
            periodic = f" (every {every} batches)"
        else:
            periodic = f" ({len(regular[1])} of them every {every} batches)"
        evidence.append(
            f"{len(found)} step{'s' if len(found) > 1 else ''} >= {t.step_spike_factor:g}x the median"
            f" {ms(median)} at batches {shown}{periodic} (warning >= {t.step_spike_count} spikes, each"
            f" >= {ms(t.step_min_spike)} above the median)"
        )
    if slow_compiles := [
        i
        for i in sorted(compiled)
        if i < len(ctx.step_times)
        and median > 0
        and reaches(ctx.step_times[i] / median, t.step_spike_factor)
        and reaches(ctx.step_times[i] - median, t.step_min_spike)
    ]:
        shown = ", ".join(str(i) for i in slow_compiles[:8]) + (", ..." if len(slow_compiles) > 8 else "")
        evidence.append(f"batch{'es' if len(slow_compiles) > 1 else ''} {shown} compiled (torch.compile): left out")
    if spiky and every:
        advice = [_periodic_advice(ctx, every)]
    elif spiky:
        advice = [_irregular_advice(ctx)]
    else:
        advice = [_spread_advice(ctx, ratio or 0.0, t)]
    title = (
        f"{stage_name(ctx.stage)} stalls every {every} batches"
        if spiky and every
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
