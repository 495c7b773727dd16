"""
Step summaries
==============

Pure functions from the per-batch measurements of :mod:`lightning_perf.collect.steps` to an
:class:`~lightning_perf.records.EpochSummary`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from lightning_perf.records import PHASES, EpochSummary, StepSplit

MAX_BARS = 2000
"""The most bars an epoch's step-split chart holds (a longer epoch's consecutive batches are merged): a bar
per batch of any epoch up to 2,000 batches, and about 40 kB in the report for the longest epoch."""


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation between ranks (numpy's default); 0 if empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize_epoch(
    *,
    stage: str,
    epoch: int,
    data_wait: Sequence[float],
    compute: Sequence[float],
    batch_sizes: Sequence[int | None],
    profiled: Sequence[bool] = (),
    loss: float | None = None,
    epoch_starts: Sequence[int] = (0,),
    phases: Sequence[Sequence[float] | None] = (),
    **memory: Any,
) -> EpochSummary:
    """One epoch's summary from its per-batch data-wait and compute times (seconds) and batch sizes; or that of
    consecutive epochs measured together, whose first batches ``epoch_starts`` lists (``epoch``: the last).

    Batches that ran inside a profiler window (``profiled``) are left out of the times, percentiles and
    throughput, since the profiler slows them down; so is a batch that started but did not end (an
    exception). ``memory`` passes the other fields of :class:`EpochSummary` through.
    """
    n = min(len(data_wait), len(compute))
    kept = [i for i in range(n) if not (i < len(profiled) and profiled[i])] or list(range(n))
    steps = [data_wait[i] + compute[i] for i in kept]
    total = sum(steps)
    waited = sum(data_wait[i] for i in kept)
    sizes = [size for i in kept if (size := batch_sizes[i]) is not None]
    samples = sum(sizes) if sizes else None
    return EpochSummary(
        stage=stage,
        epoch=epoch,
        batches=n,
        profiled_batches=n - len(kept),
        samples=samples,
        step_time=total,
        data_wait=waited,
        step_time_p50=percentile(steps, 50),
        step_time_p90=percentile(steps, 90),
        step_time_max=max(steps, default=0.0),
        data_wait_fraction=waited / total if total > 0 else 0.0,
        throughput=samples / total if samples is not None and total > 0 else None,
        loss=loss,
        first_data_wait=sum(data_wait[i] for i in epoch_starts if i < n) if n else None,
        epochs=len(epoch_starts),
        **phase_fields([p for i in kept if i < len(phases) and (p := phases[i]) is not None] if phases else []),
        **memory,
    )


def phase_fields(phases: Sequence[Sequence[float]]) -> dict[str, Any]:
    """:class:`EpochSummary`'s phase fields (``forward_time``, ``forward_p50``, ...) from the kept batches' phases;
    none without any."""
    fields: dict[str, Any] = {}
    if not phases:
        return fields
    for i, name in enumerate(PHASES):
        values = [batch[i] for batch in phases]
        fields[f"{name}_time"] = sum(values)
        fields[f"{name}_p50"] = percentile(values, 50)
        fields[f"{name}_p90"] = percentile(values, 90)
    return fields


def step_split(
    data_wait: Sequence[float],
    compute: Sequence[float],
    *,
    profiled: Sequence[bool] = (),
    compiled: Sequence[int] = (),
    max_bars: int = MAX_BARS,
) -> StepSplit:
    """An epoch's per-batch split for its chart: a bar per batch, or, for an epoch of more than ``max_bars``
    batches, a bar per ``ceil(batches / max_bars)`` consecutive batches (the mean of each part; the last bar
    may hold fewer). A missing or negative time (a clock that went backwards) counts as 0. ``profiled`` marks
    the batches inside a profiler window, ``compiled`` lists those that compiled."""
    n = min(len(data_wait), len(compute))
    per_bar = max(1, math.ceil(n / max_bars)) if max_bars > 0 else max(n, 1)

    def bars(values: Sequence[float]) -> tuple[float, ...]:
        clean = [float(v) if math.isfinite(v) and v > 0 else 0.0 for v in values[:n]]
        if per_bar == 1:
            return tuple(clean)
        return tuple(sum(clean[i : i + per_bar]) / len(clean[i : i + per_bar]) for i in range(0, n, per_bar))

    stretches: list[tuple[int, int]] = []
    for i in range(min(n, len(profiled))):
        if not profiled[i]:
            continue
        if stretches and stretches[-1][1] == i - 1:
            stretches[-1] = (stretches[-1][0], i)
        else:
            stretches.append((i, i))
    return StepSplit(
        data_wait=bars(data_wait),
        compute=bars(compute),
        per_bar=per_bar,
        profiled=tuple(stretches),
        compiled=tuple(sorted(b for b in set(compiled) if 0 <= b < n)),
    )


def pool_epochs(epochs: Sequence[EpochSummary]) -> EpochSummary:
    """Several epochs of one stage as one, for rules that need more batches than one epoch has: the last
    epoch's number and its other measurements (memory, CPU shares, FLOPs), the batches', samples' and times'
    sums, the shares and throughput over those sums, and the step-time percentiles of the epochs' own
    percentiles (exact for epochs of one batch each, where each epoch's percentiles are that batch's step).

    Notes:
        1. ``first_data_wait`` is the sum of the epochs' first waits: each epoch's first batch waits for the
           DataLoader's start-up, so over epochs of one batch each, all of the wait is start-up, which is what
           ``dataloader_bound``'s advice then says.
        2. ``cpu_wait_share``, ``other_cpu_load`` and ``cpu_steal_share`` are over the epochs' wall time together
           (each epoch's weighted by its wall time: the seconds waited and the other processes' CPU seconds,
           summed), where every epoch has them; a short epoch's own is noise (``/proc/stat`` counts in 10 ms ticks).
    """
    last = epochs[-1]
    total = sum(e.step_time for e in epochs)
    waited = sum(e.data_wait for e in epochs)
    samples = [e.samples for e in epochs]
    firsts = [e.first_data_wait for e in epochs]
    walls = [e.wall_time for e in epochs]
    return dataclasses.replace(
        last,
        batches=sum(e.batches for e in epochs),
        profiled_batches=sum(e.profiled_batches for e in epochs),
        samples=None if None in samples else sum(s or 0 for s in samples),
        step_time=total,
        data_wait=waited,
        step_time_p50=percentile([e.step_time_p50 for e in epochs], 50),
        step_time_p90=percentile([e.step_time_p90 for e in epochs], 90),
        step_time_max=max(e.step_time_max for e in epochs),
        data_wait_fraction=waited / total if total > 0 else 0.0,
        throughput=sum(s or 0 for s in samples) / total if None not in samples and total > 0 else None,
        first_data_wait=None if None in firsts else sum(f or 0.0 for f in firsts),
        epochs=sum(e.epochs for e in epochs),
        wall_time=None if None in walls else sum(w or 0.0 for w in walls),
        cpu_wait_share=_over_wall(epochs, [e.cpu_wait_share for e in epochs]),
        other_cpu_load=_over_wall(epochs, [e.other_cpu_load for e in epochs]),
        cpu_steal_share=_over_wall(epochs, [e.cpu_steal_share for e in epochs]),
    )


def _over_wall(epochs: Sequence[EpochSummary], values: Sequence[float | None]) -> float | None:
    """The mean of the epochs' ``values`` (per second of wall time), weighted by their wall time; ``None`` where
    any is unknown."""
    walls = [e.wall_time for e in epochs]
    if None in values or None in walls:
        return None
    total = sum(w or 0.0 for w in walls)
    return sum((v or 0.0) * (w or 0.0) for v, w in zip(values, walls, strict=True)) / total if total > 0 else None
