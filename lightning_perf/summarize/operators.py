"""
Operator tables
===============

The top operators of a window, chosen and ordered from plain :class:`~lightning_perf.records.OperatorStat`.
"""

from __future__ import annotations

from collections.abc import Iterable

from lightning_perf.records import OperatorStat


def default_sort_key(device: str) -> str:
    """Self device time when a device was profiled (that is where the time goes), else self CPU time."""
    return "self_device_time" if device == "cuda" else "self_cpu_time"


def top_operators(stats: Iterable[OperatorStat], *, sort_by: str, row_limit: int) -> list[OperatorStat]:
    """The ``row_limit`` operators with the largest ``sort_by`` value, largest first; ties by name.

    Operators without a value for ``sort_by`` (device time on a CPU run, memory when it was not
    profiled) sort last.
    """

    def key(stat: OperatorStat) -> tuple[float, str]:
        value = getattr(stat, sort_by)
        return (-(value if value is not None else float("-inf")), stat.name)

    return sorted(stats, key=key)[:row_limit]
