"""
Step summaries
==============

Pure functions from the per-batch measurements of :mod:`lightning_perf.collect.steps` to an
:class:`~lightning_perf.records.EpochSummary`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from lightning_perf.records import EpochSummary


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
    **memory: Any,
) -> EpochSummary:
    """One epoch's summary from its per-batch data-wait and compute times (seconds) and batch sizes.

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
        first_data_wait=data_wait[0] if n else None,
        **memory,
    )
