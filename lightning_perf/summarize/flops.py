"""
Epoch FLOPs
===========

An epoch's FLOPs per batch, achieved FLOP/s and MFU, from the batches counted during the run
(:class:`~lightning_perf.collect.flops.BatchFlopCounter`) and the epoch's per-batch clocks. Pure.

Notes:
    1. The counts are taken per sample (a count's FLOPs over its batch's samples, averaged over the counts)
       and applied to the samples of each measured batch, so that a smaller last batch counts less; where a
       count's batch size is unknown, every measured batch counts as the mean count.
    2. Achieved FLOP/s are the measured batches' FLOPs over their wall time: their step times, data wait
       included, with no device synchronization per batch (on a GPU the host runs ahead of the kernels within
       a step, but the queue holds the host back over an epoch, so the sum of step times is the device's
       time give or take one step). Over wall time is what users compare (PaLM's MFU, Lightning's
       ``ThroughputMonitor``): a step that waits for data has a lower MFU, which is why ``low_mfu`` names
       ``dataloader_bound`` among its causes.
    3. MFU is achieved FLOP/s over the device's peak for the run's dtype, where that peak is known.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class FlopCount:
    """One counted batch: its FLOPs, forward and backward, and its samples (``None``: unknown)."""

    flops: int
    samples: int | None


@dataclass(frozen=True)
class EpochFlops:
    """An epoch's FLOPs figures (``None``: unknown)."""

    flops_per_batch: float | None = None
    flops_per_second: float | None = None
    mfu: float | None = None


def epoch_flops(
    counts: Sequence[FlopCount],
    *,
    batch_sizes: Sequence[int | None],
    data_wait: Sequence[float],
    compute: Sequence[float],
    profiled: Sequence[bool],
    peak: float | None,
) -> EpochFlops:
    """The epoch's figures from the run's counts and its per-batch clocks (see the module's notes).

    Args:
        counts: The batches counted so far in the run.
        batch_sizes, data_wait, compute, profiled: Per batch of the epoch, in order: samples (``None``:
            unknown), data-wait and compute seconds, and whether it was left out (a profiler window, a count).
        peak: The device's peak FLOP/s for the run's dtype; ``None``: no MFU.

    Example::

        figures = epoch_flops([FlopCount(6e9, 32)], batch_sizes=[32, 32], data_wait=[0.0, 0.0],
                              compute=[0.1, 0.1], profiled=[False, False], peak=None)  # 6e9 per batch, 6e10 FLOP/s
    """
    if not counts:
        return EpochFlops()
    n = min(len(data_wait), len(compute), len(profiled), len(batch_sizes))
    measured = [i for i in range(n) if not profiled[i]]
    per_sample = [c.flops / c.samples for c in counts if c.samples]
    sizes = [batch_sizes[i] for i in measured]
    if per_sample and measured and all(size is not None for size in sizes):
        flops_per_sample = sum(per_sample) / len(per_sample)
        total = flops_per_sample * sum(size or 0 for size in sizes)
        per_batch = total / len(measured)
    else:
        per_batch = sum(c.flops for c in counts) / len(counts)
        total = per_batch * len(measured)
    seconds = sum(data_wait[i] + compute[i] for i in measured)
    per_second = total / seconds if seconds > 0 else None
    mfu = per_second / peak if per_second is not None and peak else None
    return EpochFlops(flops_per_batch=per_batch, flops_per_second=per_second, mfu=mfu)
