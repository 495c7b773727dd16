"""
Cross-rank summaries
====================

Each rank's epoch summary, packed into one small tensor and gathered to every rank through the
strategy's own collective (``trainer.strategy.all_gather``): one collective per stage epoch, none per
batch. Every rank calls it at every epoch end, whatever happened to its own measurements (a rank that
measured nothing sends NaNs), so that no rank is left waiting in it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import lightning.pytorch as pl
import torch

from lightning_perf.diagnose.rules import share
from lightning_perf.records import EpochSummary, RankSummary, TraceSummary

FIELDS = tuple(f.name for f in dataclasses.fields(RankSummary) if f.name != "rank")


def rank_values(summary: EpochSummary | None, windows: Sequence[TraceSummary]) -> list[float]:
    """This rank's numbers for :data:`FIELDS`, NaN where unknown."""
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


def gather_ranks(trainer: pl.Trainer, values: Sequence[float]) -> tuple[RankSummary, ...]:
    """Every rank's values, by global rank (a collective: every rank must call it)."""
    tensor = torch.tensor(list(values), dtype=torch.float64, device=trainer.strategy.root_device)
    gathered = trainer.strategy.all_gather(tensor)
    rows = gathered.reshape(-1, len(FIELDS)).cpu().tolist()
    return tuple(
        RankSummary(rank=rank, **{name: (None if math.isnan(v) else v) for name, v in zip(FIELDS, row)})
        for rank, row in enumerate(rows)
    )

