"""
Collectives table
=================

A window's collectives (:class:`~lightning_perf.records.CollectiveStats`) as aligned text, for
``lightning-perf analyze`` and the window's operator table: per kind and process group, calls per step, bytes
per call, time per step, the exposed share, and algorithm and bus bandwidth (``-`` where unknown: gloo records
no sizes).
"""

from __future__ import annotations

from collections.abc import Sequence

from lightning_perf.records import CollectiveStats
from lightning_perf.report.findings import aligned
from lightning_perf.units import bandwidth, duration_us, percent, signed_size

HEADER = ("collective", "group", "ranks", "calls/step", "bytes/call", "time/step", "exposed", "algbw", "busbw")


def collective_rows(stats: Sequence[CollectiveStats]) -> list[tuple[str, ...]]:
    """The table's cells, a header first (empty without collectives)."""
    if not stats:
        return []
    rows: list[tuple[str, ...]] = [HEADER]
    for s in stats:
        steps = s.calls / s.per_step if s.per_step > 0 else 1.0
        rows.append(
            (
                s.kind,
                s.group or "-",
                str(s.ranks),
                f"{s.per_step:g}",
                signed_size(round(s.bytes / s.calls)) if s.bytes is not None and s.calls else "-",
                duration_us(s.seconds / steps * 1e6),
                percent(s.exposed_seconds / s.seconds) if s.seconds > 0 else "-",
                bandwidth(s.algorithm_bandwidth) if s.algorithm_bandwidth is not None else "-",
                bandwidth(s.bus_bandwidth) if s.bus_bandwidth is not None else "-",
            )
        )
    return rows


def collectives_table(stats: Sequence[CollectiveStats]) -> list[str]:
    """The table as aligned text lines: the kind and the group to the left, the numbers to the right."""
    rows = collective_rows(stats)
    return aligned(rows, left=(0, 1)) if rows else []
