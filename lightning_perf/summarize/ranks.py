"""
Rank summaries
==============

Pure functions over the gathered per-rank summaries of a distributed epoch.
"""

from __future__ import annotations

from collections.abc import Sequence

from lightning_perf.records import RankSummary


def rank_work_times(ranks: Sequence[RankSummary]) -> dict[int, float]:
    """Each rank's own work per step: its median step less the share it waited in collectives (from its
    windows; without them, its median step). Under DDP every rank's step lasts as long as the slowest's, so
    this, not the step time, tells the ranks apart."""
    return {
        r.rank: r.step_time_p50 * (1 - (r.communication_share or 0.0))
        for r in ranks
        if r.step_time_p50 is not None
    }
