"""
Rank summaries
==============

Pure functions between a rank's epoch and the numbers the ranks of a distributed run exchange, and over the
per-rank summaries they give.

- :func:`rank_values`: this rank's numbers for :data:`FIELDS`, the vector every rank sends
  (:class:`~lightning_perf.collect.ranks.RankExchange` carries it).
- :func:`rank_summaries`: the gathered vectors back as :class:`~lightning_perf.records.RankSummary` rows.
- :func:`rank_summary_of_trace`: a rank's row as far as one of its traces tells it (``lightning-perf
  analyze``).
- :func:`rank_work_times`: each rank's own work per step, what the cross-rank rules compare.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from lightning_perf.records import EpochSummary, RankSummary, TraceSummary, share

#: The numbers each rank sends, in this order: every field of :class:`RankSummary` but the rank (which is the
#: row's position in the gather).
FIELDS = tuple(f.name for f in dataclasses.fields(RankSummary) if f.name != "rank")


def rank_values(summary: EpochSummary | None, windows: Sequence[TraceSummary]) -> list[float]:
    """This rank's numbers for :data:`FIELDS`, NaN where unknown.

    Args:
        summary: This rank's epoch summary; ``None`` (or an epoch without batches) when it measured nothing.
        windows: The trace summaries of its windows in that epoch; the largest share of exposed communication
            among them is its ``communication_share``.

    Example::

        values = rank_values(summary, windows)  # one float per FIELDS name, what every rank gathers
    """
    shares = [s for w in windows if (s := share(w.communication_exposed_time, w)) is not None]
    values = {
        "communication_share": max(shares, default=None),
        **(
            {name: getattr(summary, name) for name in FIELDS if hasattr(summary, name)}
            if summary is not None and summary.batches
            else {}
        ),
    }
    return [math.nan if values.get(name) is None else float(values[name]) for name in FIELDS]


def rank_summaries(rows: Sequence[Sequence[float]]) -> tuple[RankSummary, ...]:
    """One :class:`RankSummary` per row of :data:`FIELDS` values, by global rank (NaN: unknown)."""
    return tuple(
        RankSummary(rank=rank, **{name: (None if math.isnan(v) else v) for name, v in zip(FIELDS, row, strict=False)})
        for rank, row in enumerate(rows)
    )


def rank_summary_of_trace(rank: int, summary: TraceSummary) -> RankSummary:
    """A rank's row of the cross-rank table, as far as one of its traces (``summary``) tells it: its mean
    step as the median, its data wait and exposed communication as shares of the step, nothing else."""
    return RankSummary(
        rank=rank,
        step_time_p50=summary.step_time,
        step_time_p90=None,
        step_time_max=None,
        data_wait_fraction=share(summary.dataloader_time, summary),
        throughput=None,
        host_rss_peak=None,
        cuda_max_allocated=None,
        cuda_max_reserved=None,
        communication_share=share(summary.communication_exposed_time, summary),
    )


def rank_cpu_waits(ranks: Sequence[RankSummary]) -> dict[int, float]:
    """Each rank's share of its epoch its training thread waited for a CPU (where it was measured)."""
    return {r.rank: r.cpu_wait_share for r in ranks if r.cpu_wait_share is not None}


def rank_waits(ranks: Sequence[RankSummary]) -> dict[int, float]:
    """Each rank's share of its step spent in collectives with no compute overlapping (where its windows tell)."""
    return {r.rank: r.communication_share for r in ranks if r.communication_share is not None}


def rank_work_times(ranks: Sequence[RankSummary]) -> dict[int, float]:
    """Each rank's own work per step: its median step less the share it waited in collectives (from its
    windows; without them, its median step). Under DDP every rank's step lasts as long as the slowest's, so
    this, not the step time, tells the ranks apart."""
    return {
        r.rank: r.step_time_p50 * (1 - (r.communication_share or 0.0)) for r in ranks if r.step_time_p50 is not None
    }
