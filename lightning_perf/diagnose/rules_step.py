"""
Training loop rules
===================

Where the step's time goes besides the model's forward and backward: ``optimizer_heavy``,
``validation_heavy``, ``framework_overhead``. Whether it is steady, ``step_time_unstable``, is
:mod:`~lightning_perf.diagnose.rules_unstable`'s.
"""

from __future__ import annotations

from lightning_perf.diagnose.library_routes import optimizer_route, routed
from lightning_perf.diagnose.loader_advice import BAR_REFRESH
from lightning_perf.diagnose.model import Finding, StageEpoch
from lightning_perf.diagnose.optimizer_tried import optimizer_setting, tried_optimizer_advice
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
from lightning_perf.diagnose.thresholds import Thresholds
from lightning_perf.records import EpochSummary, TraceSummary, share
from lightning_perf.units import count, limit, ms, percent, plural, seconds

# What Lightning's bookkeeping takes at each `self.log` call, whatever the cadence it logs at (a clone, a detach,
# device moves and a running mean per value). Measured on the demo's validation (examples/demo.py, 2 values a
# step, 2-CPU machine, 1 torch thread): steps of 1.09 ms, 0.29 ms once the values were summed in the module and
# logged in on_validation_epoch_end; 0.4 ms a value. The trace shows it as Python between `aten::to` calls.
SELF_LOG_COST = 4e-4


def optimizer_heavy(ctx: StageEpoch, t: Thresholds) -> Finding | None:
    """The optimizer's own update (after forward and backward) takes a large share of the training step.

    Notes:
        1. Training only: no other stage steps an optimizer.
        2. On every batch, where the epoch has its phase split (:mod:`lightning_perf.collect.phases`): the
           optimizer phase (``zero_grad``, the closure's bookkeeping, gradient clipping and the update) over the
           step time, both summed over the epoch's measured batches. Fires, as a warning, at ``optimizer_update``
           where the phase also takes ``optimizer_min_time`` per batch; a window, where one recorded the update's
           operators, adds them to the evidence (and whether they were multi-tensor).
        3. Without a split (a report from before it): per window, ``optimizer_update_time`` / step time, in the
           window with the largest share among those whose update also takes ``optimizer_min_time`` per step.
        4. Advice names only what would change something: the run's own optimizer class (``RunFacts.optimizer``),
           ``fused=True`` unless it is set already or the class has no fused kernels, and fewer states only for
           Adam-style optimizers; on CUDA ``foreach`` where the trace shows a per-parameter loop. On CPU only
           ``fused`` is advised: ``foreach`` runs the same per-parameter loop there
           (measured with torch 2.13 on one CPU thread, Adam: 400 tensors of 4 floats 30 ms per step looped,
           29 ms foreach, 11 ms fused; 20 tensors of 256x256 9.6, 17 and 5.0 ms).
        5. Where the advised implementation was tried on copies of the run's optimizer (``StageEpoch.advice_trials``,
           :mod:`~lightning_perf.diagnose.optimizer_tried`), the advice leads with the measurement; one whose trial
           was not ``advice_trial_min_gain`` times as fast is withdrawn, and the finding is ``info``.
    """
    if ctx.stage != "train":
        return None
    best = strongest(
        (w for w in ctx.windows if reaches(w.optimizer_update_time, t.optimizer_min_time)),
        lambda w: share(w.optimizer_update_time, w),
    )
    epoch = ctx.epoch
    if epoch.optimizer_time is not None:  # every batch judges (Notes 2); a window adds its operators
        batches, total = max(epoch.measured_batches, 1), epoch.step_time
        value = epoch.optimizer_time / total if total > 0 else 0.0
        if not reaches(value, t.optimizer_update) or not reaches(epoch.optimizer_time / batches, t.optimizer_min_time):
            return None
        window = best[0] if best is not None else None
        evidence = [
            f"the optimizer step takes {percent(value)} of each training step over {count(batches)} batches"
            f" ({ms(epoch.optimizer_time / batches)} of {ms(total / batches)} a batch; median batch"
            f" {ms(epoch.optimizer_p50 or 0.0)}, p90 {ms(epoch.optimizer_p90 or 0.0)}; warning >="
            f" {limit(t.optimizer_update)} and >= {ms(t.optimizer_min_time)} a batch)"
        ]
    elif best is None or not reaches(best[1], t.optimizer_update):
        return None
    else:
        window, value = best
        evidence = [
            f"optimizer update {percent(value)} of the step ({ms(window.optimizer_update_time)} of"
            f" {ms(window.step_time)}) {in_window(window, len(ctx.windows))}"
            f" (warning >= {limit(t.optimizer_update)} and >= {ms(t.optimizer_min_time)} per step)"
        ]
    foreach = window.optimizer_foreach if window is not None else None
    if window is not None:
        evidence.append(
            f"{in_window(window, len(ctx.windows))} the update is {count(window.optimizer_update_ops)} operators"
            + (
                ""
                if foreach is None
                else ": multi-tensor (foreach) or fused kernels"
                if foreach
                else ": a loop over the parameters (no foreach)"
            )
        )
    advice, withdrawn = tried_optimizer_advice(
        ctx.advice_trials,
        [_optimizer_advice(ctx, foreach, fused_kernels=window.optimizer_fused if window is not None else None)],
        t.advice_trial_min_gain,
    )
    if (setting := optimizer_setting(advice)) is not None:  # where a library builds the optimizer: how to pass it
        advice = routed(advice, f"{setting})`", optimizer_route(ctx.facts, setting))
    return finding(
        ctx,
        "optimizer_heavy",
        "info" if withdrawn else "warning",
        f"Optimizer update takes {percent(value)} of each training step",
        evidence,
        advice,
        window,
    )


def _other_phase(ctx: StageEpoch, t: Thresholds) -> tuple[float, str] | None:
    """The epoch's other phase (``framework_overhead``, Notes 4), as its share of the step and its evidence, where
    it reaches the thresholds; ``None`` where not, or without a split."""
    epoch = ctx.epoch
    if epoch.other_time is None or epoch.step_time <= 0:
        return None
    batches = max(epoch.measured_batches, 1)
    value = epoch.other_time / epoch.step_time
    if not reaches(value, t.framework_overhead) or not reaches(epoch.other_time / batches, t.framework_min_time):
        return None
    return value, (
        f"after the optimizer step, Lightning's bookkeeping and the callbacks' hooks take {percent(value)} of each"
        f" step over {count(batches)} batches ({ms(epoch.other_time / batches)} a batch; median batch"
        f" {ms(epoch.other_p50 or 0.0)}; warning >= {limit(t.framework_overhead)} and >= {ms(t.framework_min_time)}"
        " a batch)"
    )


def _optimizer_advice(ctx: StageEpoch, foreach: bool | None, *, fused_kernels: bool | None = None) -> str:
    """What would make the run's own optimizer's update cheaper: only changes it has not made (its class and
    ``fused`` setting, as configured, and whether the trace shows multi-tensor or ``fused`` kernels: a trace
    alone, in ``lightning-perf analyze``, knows no configuration)."""
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
    if facts.optimizer_fused or fused_kernels:
        how = f"`{name}(..., fused=True)`" if facts.optimizer_fused or facts.optimizer else "its kernels are fused"
        return (
            f"The update is already fused ({how}): its time is the fused kernels' own work over the parameters."
            + smaller
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
        2. Fires, as a warning, at ``validation`` when validation also takes ``validation_min_time`` or more.
        3. Advice names the step-based setting (``val_check_interval`` with ``check_val_every_n_epoch=None``)
           where validation runs every N training batches.
        4. A record of several short epochs (``EpochSummary.epochs``) holds several validation runs, and its
           validation records several each: the runs per training epoch are their ``epochs`` over its own.
    """
    if ctx.stage != "train" or not ctx.validation:
        return None
    facts = ctx.facts
    runs = sum(v.epochs for v in ctx.validation)  # a record of a run of short epochs holds several runs
    per_epoch = runs / max(ctx.epoch.epochs, 1)
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
        f" {'this epoch' if ctx.epoch.epochs == 1 else f'these {ctx.epoch.epochs} epochs'}"
        f" {plural(runs, 'run')} of {batches} batches"
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
                f", and a larger `val_check_interval` runs fewer than the {per_epoch:g} validations per epoch"
                if per_epoch > 1
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
        4. On every training batch, where the epoch has its phase split (:mod:`lightning_perf.collect.phases`):
           its other phase (Lightning's bookkeeping after the update, the callbacks before ours at the batch's
           end) is framework time too, a part of it. It fires by the same thresholds where no window shows
           more, and is evidence beside a window's.
        5. Where the stage iterates no torch DataLoader (``RunFacts.iterable_class``), a window's step holds that
           iterable making the next batch, outside any operator and any DataLoader span: the epoch's data wait per
           batch is taken out of the window's framework time (``dataloader_bound`` judges it).
    """
    epoch = ctx.epoch
    unseen = epoch.data_wait / max(epoch.measured_batches, 1) if ctx.facts.iterable_class is not None else 0.0

    def framework(w: TraceSummary) -> float:
        return max(w.framework_time - unseen, 0.0)

    best = strongest(
        (w for w in ctx.windows if reaches(on_cpu(framework(w), w)[0], t.framework_min_time)),
        lambda w: on_cpu_share(framework(w), w),
    )
    other = _other_phase(ctx, t)
    if (best is None or not reaches(best[1], t.framework_overhead)) and other is None:
        return None
    window: TraceSummary | None = None
    evidence = []
    if best is not None and reaches(best[1], t.framework_overhead):
        window, value = best
        real, step = on_cpu(framework(window), window)
        evidence.append(
            f"{percent(value)} of the step outside any torch operator ({ms(real)} of {ms(step)})"
            + (
                f" once the {ms(window.step_time - step)} per step waiting for a CPU is left out"
                if step < window.step_time
                else ""
            )
            + f" {in_window(window, len(ctx.windows))} (warning >= {limit(t.framework_overhead)}"
            f" and >= {ms(t.framework_min_time)} per step)"
        )
    if other is not None:
        evidence.append(other[1])
        if window is None:
            value = other[0]
    hook = f"a callback or hook (`{batch_end_hook(ctx.stage)}`, ...) doing work every batch"
    progress_bar = f"the progress bar (`TQDMProgressBar(refresh_rate={BAR_REFRESH})` or `enable_progress_bar=False`)"
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
        " 0.3-1 ms of each step (measured on 2-CPU machines), which no setting removes."
        + (" The gaps between operators in this window's trace show where the time goes." if window else "")
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
