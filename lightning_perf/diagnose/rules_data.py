"""
Input pipeline rules
====================

``dataloader_bound`` (the step waits for the next batch) and ``h2d_copy`` (the device waits for the batch's
copy to it).
"""

from __future__ import annotations

from lightning_perf.diagnose.model import Finding, RunFacts, StageEpoch
from lightning_perf.diagnose.rules import (
    cpus_per_process,
    finding,
    in_window,
    limit,
    ms,
    on_cuda,
    percent,
    reaches,
    stage_name,
    strongest,
)
from lightning_perf.diagnose.thresholds import Thresholds
from lightning_perf.records import share

# Advice only: the most workers we suggest from scratch. Lightning suggests up to the CPUs per device minus
# one (``suggested_max_num_workers``); beyond about 8 workers returns diminish for most pipelines while each
# worker holds a copy of the dataset object and ``prefetch_factor`` batches (our judgment).
MAX_SUGGESTED_WORKERS = 8


def suggested_workers(facts: RunFacts) -> int:
    """Workers to suggest: Lightning's ``suggested_max_num_workers`` (CPUs per process minus one), at most 8;
    4 when the CPU count is unknown."""
    per_process = cpus_per_process(facts)
    if per_process is None:
        return 4
    return max(1, min(MAX_SUGGESTED_WORKERS, per_process - 1))


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
    if facts.cpu_count is not None:
        parts.append(f"{facts.cpu_count} CPU{'s' if facts.cpu_count != 1 else ''}")
    return ", ".join(parts)


def dataloader_bound(ctx: StageEpoch, t: Thresholds) -> Finding | None:
    """The stage's steps wait for the DataLoader.

    Notes:
        1. Measures the epoch's data wait / step time, from every batch (no profiler needed).
        2. Fires at ``dataloader_warning``; critical at ``dataloader_critical``.
        3. Points at the window whose DataLoader spans take the largest share of the step, when that share
           reaches ``dataloader_warning`` too.
        4. Advice follows the DataLoader's settings: no workers, workers already using every CPU (then the
           CPU is the limit), pinned memory on CUDA, persistent workers.
    """
    epoch = ctx.epoch
    fraction = epoch.data_wait_fraction
    if epoch.batches <= 0 or epoch.step_time <= 0 or not reaches(fraction, t.dataloader_warning):
        return None
    severity = "critical" if reaches(fraction, t.dataloader_critical) else "warning"
    facts = ctx.facts
    evidence = [
        f"data wait {percent(fraction)} of step time over {epoch.measured_batches} batches"
        f" ({ms(epoch.data_wait / max(epoch.measured_batches, 1))} per batch)"
        f" (warning >= {limit(t.dataloader_warning)}, critical >= {limit(t.dataloader_critical)})"
    ]
    best = strongest(ctx.windows, lambda w: share(w.dataloader_time, w))
    if best is not None and reaches(best[1], t.dataloader_warning):
        window, value = best
        evidence.append(
            f"{in_window(window, len(ctx.windows))} the DataLoader takes {percent(value)} of each step"
            f" ({ms(window.dataloader_time)} of {ms(window.step_time)})"
        )
    elif best is not None:  # the windows' batches were not the slow ones, or the wait is not the DataLoader's
        evidence.append(f"the profiler windows show less (at most {percent(best[1])} of a step in the DataLoader)")
        best = None
    evidence.append(loader_facts(facts))
    advice = _dataloader_advice(facts)
    if ctx.windows and best is None:
        # The DataLoader's own spans are small in every window: the wait between batches is mostly elsewhere.
        advice = [
            "The DataLoader itself is a small part of the wait in the profiler windows: look at what else runs"
            " between batches, in the window's trace between `ProfilerStep` spans: the batch's transfer and"
            " `on_after_batch_transfer`/`transfer_batch_to_device`, other callbacks' `on_*_batch_start/end`"
            " hooks, and Lightning's loop itself (about 0.3 ms a batch, which shows only when steps are a few ms)."
            " If the DataLoader's share varies between batches, more workers still help:",
            *advice,
        ]
    return finding(
        ctx,
        "dataloader_bound",
        severity,
        f"{stage_name(ctx.stage)} waits for data {percent(fraction)} of the time",
        evidence,
        advice,
        best[0] if best else None,
    )


def _dataloader_advice(facts: RunFacts) -> list[str]:
    workers, cpus = facts.num_workers, facts.cpu_count
    suggested = suggested_workers(facts)
    advice = []
    if workers == 0:
        advice.append(
            f"Set `DataLoader(num_workers={suggested})`: batches are then loaded in {suggested} background"
            f" process{'es' if suggested > 1 else ''} while the model computes, usually the single largest win"
            " (Lightning's \"does not have many workers which may be a bottleneck\" warning says the same)."
        )
    elif workers is not None and cpus is not None and workers >= cpus:
        advice.append(
            f"The CPU is the limit: num_workers={workers} already uses all {cpus} CPUs, so more workers will"
            " not help. Make each sample cheaper: move augmentation to the GPU on whole batches (in"
            " `LightningModule.on_after_batch_transfer`), cache decoded or preprocessed data (once, to disk or"
            " memory), use a faster decoder (e.g. `torchvision.io.decode_jpeg(..., device=\"cuda\")`), or store"
            " smaller inputs."
        )
    elif workers is not None:
        target = min(cpus, max(2 * workers, suggested)) if cpus is not None else 2 * workers
        advice.append(
            f"Raise `DataLoader(num_workers=...)` from {workers} to about {target}"
            + (f" ({cpus} CPUs available)" if cpus is not None else "")
            + ", and `prefetch_factor` (batches queued per worker, default 2) if loading time varies."
        )
    else:
        advice.append(
            f"Check the DataLoader's `num_workers` (0 loads every batch in the training process): set"
            f" `DataLoader(num_workers={suggested})` to load batches in the background."
        )
    if facts.device.startswith("cuda") and facts.pin_memory is False:
        advice.append(
            "Set `pin_memory=True`: copies from pinned memory run asynchronously (Lightning already moves"
            " batches with `non_blocking=True`)."
        )
    if workers and facts.persistent_workers is False:
        advice.append(
            "Set `persistent_workers=True`, which keeps the workers alive between epochs and removes their"
            " start-up at every epoch."
        )
    return advice


def h2d_copy(ctx: StageEpoch, t: Thresholds) -> Finding | None:
    """Host-to-device copies leave the GPU idle (CUDA only).

    Notes:
        1. Per window: host-to-device copy time during which no kernel ran / step time.
        2. Fires at ``h2d_copy`` in the window where the share is highest; warning.
        3. Advice leads with ``pin_memory=True`` when the copies came from pageable memory or the
           DataLoader does not pin.
    """
    if not on_cuda(ctx):
        return None
    best = strongest(ctx.windows, lambda w: share(w.h2d_exposed_time, w))
    if best is None or not reaches(best[1], t.h2d_copy):
        return None
    window, value = best
    facts = ctx.facts
    pageable = window.h2d_pageable
    evidence = [
        f"host-to-device copies with no kernel running take {percent(value)} of the step"
        f" ({ms(window.h2d_exposed_time or 0.0)} of {ms(window.step_time)}, copies {ms(window.h2d_time or 0.0)}"
        f" in all) {in_window(window, len(ctx.windows))} (warning >= {limit(t.h2d_copy)})",
        {True: "some copies come from pageable memory", False: "copies come from pinned memory"}.get(pageable, ""),
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
