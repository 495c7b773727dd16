"""
Input pipeline rules
====================

``dataloader_bound`` (the step waits for the next batch) and ``h2d_copy`` (the device waits for the batch's
copy to it).
"""

from __future__ import annotations

from lightning_perf.diagnose.advice_tried import advised_setting, tried_advice
from lightning_perf.diagnose.busy_machine import busy_note, busy_share, idle_time, kept_note
from lightning_perf.diagnose.library_routes import iterable_route, loader_route, routed, samples_route
from lightning_perf.diagnose.loader_advice import loader_advice
from lightning_perf.diagnose.loading import CPU_BOUND, Loading, loading, loading_evidence
from lightning_perf.diagnose.model import Finding, RunFacts, Severity, StageEpoch
from lightning_perf.diagnose.rule_helpers import below, finding, in_window, on_cuda, reaches, stage_name, strongest
from lightning_perf.diagnose.sample_loading import per_sample_advice, per_sample_evidence, per_sample_loading
from lightning_perf.diagnose.thresholds import Thresholds
from lightning_perf.records import share
from lightning_perf.units import limit, ms, percent


def loader_facts(facts: RunFacts) -> str:
    """The DataLoader settings and CPUs that shape the advice, as evidence: only those known."""
    parts = [
        f"{name}={value}"
        for name, value in (
            ("num_workers", facts.num_workers),
            ("pin_memory", facts.pin_memory),
            ("persistent_workers", facts.persistent_workers),
            ("batch_size", facts.batch_size),
        )
        if value is not None
    ]
    if facts.dataset == "iterable":
        parts.append("an IterableDataset")
    if facts.cpu_count is not None:
        parts.append(f"{facts.cpu_count} CPU{'s' if facts.cpu_count != 1 else ''}")
    if facts.torch_threads is not None and facts.device == "cpu":
        parts.append(f"{facts.torch_threads} torch thread{'s' if facts.torch_threads != 1 else ''}")
    return ", ".join(parts)


def dataloader_bound(ctx: StageEpoch, t: Thresholds) -> Finding | None:
    """The stage's steps wait for the DataLoader.

    Notes:
        1. Measures the epoch's data wait / step time, from every batch (no profiler needed), the first
           batch's DataLoader start-up included. An epoch pooled with the latest ones (too few batches) says so
           ("over the last 2 epochs, 8 batches").
        2. Fires at ``dataloader_warning``; critical at ``dataloader_critical``; never when the mean wait per
           batch is below ``dataloader_min_wait``.
        3. Points at the window whose DataLoader spans take the largest share of the step, when that share
           reaches ``dataloader_warning`` too.
        4. Advice is predicted from the run's facts (:mod:`~lightning_perf.diagnose.loader_advice`): free
           CPUs, more workers than CPUs, CPU-bound or waiting loading, the workers' start-up, and a dataset that
           shares state with the module. When the windows show the wait is not the DataLoader's, it says where
           else to look.
        5. Where a window shows the dataset making torch calls sample by sample in the training process
           (:mod:`~lightning_perf.diagnose.sample_loading`), the advice leads with loading whole batches, and
           its predicted saving.
        6. Where no change is predicted to help (workers would not pay, and no per-sample work is seen), the
           finding is ``info``: it says what was measured and what to check, not that something must change.
        7. Where the windows show the DataLoader's own spans to be a small part of the step, and nothing of the
           DataLoader's own explains the wait (more workers than CPUs, the workers' start-up), the gap between
           batches is Lightning's loop, the hooks and the batch's transfer, not data: the title says "between
           batches, outside the DataLoader", the advice what else runs there, and it is at most a warning.
        8. On a busy machine (``cpu_contention``), the severity is set by the part of the wait spent off the CPU,
           which the busy machine does not explain (:func:`_on_a_busy_machine`); but for per-sample loading,
           whose evidence is a count of calls per sample, which no busy machine changes: it is kept unless the
           wait per batch, as an idle machine could have it (:func:`~lightning_perf.diagnose.contention.
           idle_time`), is below ``dataloader_min_wait``.
        9. Where the advised DataLoader setting was tried on the run's own data (``StageEpoch.advice_trials``,
           :mod:`~lightning_perf.diagnose.advice_tried`), the advice leads with the measurement; a setting whose
           trial was not ``advice_trial_min_gain`` times as fast is withdrawn, and the finding is ``info`` unless
           per-sample loading holds it up; one that could not be tried says why.
        10. Where the stage iterates no torch DataLoader (``RunFacts.iterable_class``: a library's batch
            generator, such as gluonts' ``IterableSlice``), the wait is that iterable making each batch in the
            training process: no DataLoader span shows it in a trace, so Notes 3, 4 and 7 do not apply; the
            advice is the DataLoader's, then how to get a DataLoader to set (:func:`_iterable_wrap`).
    """
    epoch = ctx.epoch
    fraction = epoch.data_wait_fraction
    measured = max(epoch.measured_batches, 1)
    if epoch.batches <= 0 or epoch.step_time <= 0 or not reaches(fraction, t.dataloader_warning):
        return None
    if below(epoch.data_wait / measured, t.dataloader_min_wait):
        return None
    severity: Severity = "critical" if reaches(fraction, t.dataloader_critical) else "warning"
    facts = ctx.facts
    load = loading(ctx)
    evidence = [
        f"data wait {percent(fraction)} of step time over {ctx.over_batches()}"
        f" ({ms(epoch.data_wait / measured)} per batch)"
        f" (warning >= {limit(t.dataloader_warning)}, critical >= {limit(t.dataloader_critical)},"
        f" and >= {ms(t.dataloader_min_wait)} per batch)"
    ]
    iterable = facts.iterable_class is not None  # no DataLoader: the wait is the iterable's own work (Notes 10)
    best = None if iterable else strongest(ctx.windows, lambda w: share(w.dataloader_time, w))
    if best is not None and reaches(best[1], t.dataloader_warning):
        window, value = best
        evidence.append(
            f"{in_window(window, len(ctx.windows))} the DataLoader takes {percent(value)} of each step"
            f" ({ms(window.dataloader_time)} of {ms(window.step_time)})"
        )
    elif best is not None:  # the windows' batches were not the slow ones, or the wait is not the DataLoader's
        evidence.append(f"the profiler windows show less (at most {percent(best[1])} of a step in the DataLoader)")
        best = None
    if iterable:
        evidence.append(_iterable_evidence(facts))
    evidence.append(loader_facts(facts))
    evidence.extend(loading_evidence(load, facts))
    per_sample = None if facts.shared_state or iterable else per_sample_loading(ctx, load.steady_wait())
    unseen = bool(ctx.windows) and best is None and per_sample is None and not iterable  # by the windows
    advice = loader_advice(ctx, load, elsewhere=unseen)
    elsewhere = advice.elsewhere  # nothing of the DataLoader's own (its workers, their start-up) explains it
    lines = advice.lines
    title = f"{stage_name(ctx.stage)} waits for data {percent(fraction)} of the time"
    if per_sample is not None:
        evidence.append(per_sample_evidence(per_sample))
        lines = [per_sample_advice(per_sample, load.per_epoch), *(lines if advice.predicted_gain else [])]
    elif elsewhere:
        # The windows show the DataLoader is a small part of the gap between batches: what was measured is the
        # time between batches (Lightning's loop, hooks, the batch's transfer), not data (Notes 7).
        title = (
            f"{stage_name(ctx.stage)} spends {percent(fraction)} of each step between batches, outside the DataLoader"
        )
        severity = "warning" if severity == "critical" else severity
    elif not advice.predicted_gain:
        severity = "info"
    lines, withdrawn = tried_advice(ctx.advice_trials, "dataloader_bound", lines, t.advice_trial_min_gain)
    if (setting := advised_setting(lines)) is not None:  # where a library builds the DataLoader: how to pass it
        lines = routed(lines, f"`DataLoader({setting})`", loader_route(facts, setting))
    if per_sample is not None:
        lines = routed(lines, "`DataLoader(samples, ...)`", samples_route(facts))
    if iterable:  # how to get a DataLoader to set
        lines = [*lines, _iterable_wrap(facts)]
    if withdrawn and per_sample is None:
        severity = "info"  # the trial measured no gain from the advised setting, and nothing else holds it up
    if (busy := busy_share(ctx, t)) is not None and severity != "info":
        if per_sample is not None:
            # Its calls per sample are no busy machine's doing, but their time is: judged on an idle machine's.
            if below(idle_time(epoch.data_wait / measured, busy), t.dataloader_min_wait):
                severity = "info"
                evidence.insert(0, busy_note(busy).removesuffix("; "))
            else:
                why = "its calls per sample are counted, not timed, and an idle machine's wait would still reach"
                evidence.insert(0, kept_note(busy, f"{why} {ms(t.dataloader_min_wait)} per batch").removesuffix("; "))
        elif elsewhere:
            # Between batches outside the DataLoader (the loop, hooks), a busy machine explains the time off the
            # CPU too: a descheduled thread holding the GIL blocks the training thread there.
            severity = "info"
            evidence.insert(0, busy_note(busy).removesuffix("; "))
        else:
            severity = _on_a_busy_machine(ctx, t, busy, evidence, load)
    return finding(
        ctx,
        "dataloader_bound",
        severity,
        title,
        evidence,
        lines,
        per_sample.window if per_sample is not None else best[0] if best else None,
    )


def iterable_name(facts: RunFacts) -> str:
    """The iterable a stage without a DataLoader iterates, named with its library: "`gluonts`'s `IterableSlice`"."""
    library = facts.iterable_library
    return f"`{library}`'s `{facts.iterable_class}`" if library else f"a `{facts.iterable_class}`"


def _iterable_evidence(facts: RunFacts) -> str:
    return (
        f"the batches come from {iterable_name(facts)}, not a torch DataLoader: the Trainer iterates it in the"
        " training process, which makes each batch between the steps (no DataLoader span shows it in a trace)"
    )


def _iterable_wrap(facts: RunFacts) -> str:
    """Where the stage iterates no DataLoader (Notes 10): how a DataLoader setting of the advice applies."""
    wrap = (
        "wrap what makes the batches in a `torch.utils.data.IterableDataset` whose `__iter__` makes and yields"
        " them, each worker only its own share (by `torch.utils.data.get_worker_info()`), and give the Trainer"
        " `DataLoader(dataset, batch_size=None, ...)` with those settings"
    )
    if (route := iterable_route(facts)) is not None:
        return f"No DataLoader to set: the Trainer iterates {iterable_name(facts)}. {route} Else {wrap}."
    if facts.iterable_library:
        return (
            f"No DataLoader to set: the Trainer iterates {iterable_name(facts)}, which its library makes. Look for"
            f" the library's own option to load in worker processes, or to cache the transformed data; else {wrap}."
        )
    return f"No DataLoader to set: the Trainer iterates {iterable_name(facts)} itself. To load in workers, {wrap}."


def _on_a_busy_machine(ctx: StageEpoch, t: Thresholds, busy: float, evidence: list[str], load: Loading) -> Severity:
    """The severity of a data wait measured while the training thread waited for a CPU ``busy`` of the epoch:
    kept only where loading is mostly off the CPU (``EpochSummary.loading_cpu_share`` below ``CPU_BOUND``: a
    dataset that sleeps, reads a disk or the network), which a busy machine does not explain; and set by that
    part of the step, neither running nor queued for a CPU (``EpochSummary.loading_queue_share``: a woken
    thread's queueing is the busy machine's); else ``info``. Opens ``evidence`` with why. (Loading on the CPU also
    shows time off it on a busy machine: a thread of the process holding the GIL is descheduled, and the training
    thread blocks on it.) The sampled waits never include an epoch's first batch: where its wait beyond a steady
    batch's is longer than the epoch's whole wait for a CPU (an iterable dataset that sets up in ``__iter__``), no
    busy machine explains it either, and that part of the step sets the severity."""
    epoch = ctx.epoch
    waited = busy * (epoch.wall_time or 0.0)
    first = epoch.data_wait_fraction * load.first_share
    if epoch.wall_time and load.first > waited and reaches(first, t.dataloader_warning):
        beyond = f"{ms(load.first / max(load.epochs, 1))} beyond a steady batch's"
        why = (
            f"the first batch waited {ms(load.first_wait())}, {beyond}"
            if load.epochs <= 1
            else f"the first batches of the last {load.epochs} epochs waited {ms(load.first_wait())} each, {beyond}"
            f" ({ms(load.first)} in all)"
        ) + f": more than the machine made the run wait in all ({ms(waited)})"
        evidence.insert(0, kept_note(busy, why).removesuffix("; "))
        return "critical" if reaches(first, t.dataloader_critical) else "warning"
    on_cpu, queued = epoch.loading_cpu_share, min(epoch.loading_queue_share or 0.0, 1.0)
    off = None if on_cpu is None else epoch.data_wait_fraction * (1.0 - queued) * max(0.0, 1.0 - on_cpu)
    if off is None or on_cpu is None or on_cpu >= CPU_BOUND or not reaches(off, t.dataloader_warning):
        evidence.insert(0, busy_note(busy).removesuffix("; "))
        return "info"
    why = f"{percent(off)} of the step waited off the CPU, neither running nor queued for one"
    evidence.insert(0, kept_note(busy, f"{why}: no busy machine explains that").removesuffix("; "))
    return "critical" if reaches(off, t.dataloader_critical) else "warning"


def h2d_copy(ctx: StageEpoch, t: Thresholds) -> Finding | None:
    """Host-to-device copies leave the GPU idle (CUDA only).

    Notes:
        1. Per window: host-to-device copy time during which no kernel ran / step time.
        2. Fires at ``h2d_copy`` in the window where the share is highest, among those where the exposed
           copies take ``h2d_min_time`` per step or more; warning.
        3. Advice leads with ``pin_memory=True`` when the copies came from pageable memory or the
           DataLoader does not pin.
    """
    if not on_cuda(ctx):
        return None
    best = strongest(
        (w for w in ctx.windows if reaches(w.h2d_exposed_time or 0.0, t.h2d_min_time)),
        lambda w: share(w.h2d_exposed_time, w),
    )
    if best is None or not reaches(best[1], t.h2d_copy):
        return None
    window, value = best
    facts = ctx.facts
    pageable = window.h2d_pageable
    evidence = [
        f"host-to-device copies with no kernel running take {percent(value)} of the step"
        f" ({ms(window.h2d_exposed_time or 0.0)} of {ms(window.step_time)}, copies {ms(window.h2d_time or 0.0)}"
        f" in all) {in_window(window, len(ctx.windows))} (warning >= {limit(t.h2d_copy)} and"
        f" >= {ms(t.h2d_min_time)} per step)",
        ""
        if pageable is None
        else "some copies come from pageable memory"
        if pageable
        else "copies come from pinned memory",
        f"pin_memory={facts.pin_memory}" if facts.pin_memory is not None else "",
    ]
    advice = []
    if pageable or facts.pin_memory is False:
        advice.append(
            "Set `DataLoader(pin_memory=True)`: Lightning moves batches with `non_blocking=True`, which only"
            " overlaps the copy with compute when the source is pinned; from pageable memory each copy blocks."
        )
    else:
        advice.append(
            "The copies are pinned but still not hidden behind compute: reduce the bytes per batch, or"
            " prefetch the next batch to the device on a side CUDA stream."
        )
    advice.append(
        "Keep data that fits on the device there (move a small dataset to the GPU once in `setup` and index it"
        " there), and send smaller dtypes (uint8 images converted to float on the GPU in"
        " `on_after_batch_transfer`, int32 rather than int64 indices)."
    )
    return finding(
        ctx,
        "h2d_copy",
        "warning",
        f"{stage_name(ctx.stage)} copies to the GPU {percent(value)} of each step with the GPU idle",
        evidence,
        advice,
        window,
    )
