"""
Interval algebra
================

Time intervals as ``(start, end)`` tuples of microseconds; *merged* ones (what :func:`union` and
:func:`merge_arrays` return) sorted and disjoint, touching ones joined. What the step summary
(:mod:`lightning_perf.summarize.step_summary`) adds up: lengths of unions within the steps, time in one set and
not in another, which points lie inside. Plain Python on lists, numpy where the input is arrays.

This module imports neither torch nor lightning.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

Interval = tuple[float, float]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering the same time (touching ones merged)."""
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        elif end > start:
            merged.append((start, end))
    return merged


def merge_arrays(starts: Any, ends: Any) -> list[Interval]:
    """:func:`union` of intervals given as arrays of starts (sorted) and ends: a new block starts where a
    start lies beyond every end before it; a block ends at the running maximum of ends."""
    if not len(starts):
        return []
    reach = np.maximum.accumulate(ends)
    first = np.flatnonzero(np.concatenate(([True], starts[1:] > reach[:-1])))
    block_starts, block_ends = starts[first], reach[np.append(first[1:] - 1, len(starts) - 1)]
    kept = block_ends > block_starts
    return list(zip(block_starts[kept].tolist(), block_ends[kept].tolist(), strict=True))


def length_within(merged: Sequence[Interval], ranges: Sequence[Interval]) -> float:
    """The length of merged intervals within merged ``ranges`` (the steps: one or a few): per range, the
    intervals overlapping it found by bisection, the first and last clipped to it."""
    total = 0.0
    for low, high in ranges:
        i = bisect_right(merged, (low, float("inf"))) - 1  # the last starting at or before low
        if i < 0 or merged[i][1] <= low:
            i += 1
        j = bisect_left(merged, (high, float("-inf")))  # the first starting at or after high
        if i >= j:
            continue
        if j - i == 1:
            total += max(min(merged[i][1], high) - max(merged[i][0], low), 0.0)
            continue
        total += min(merged[i][1], high) - max(merged[i][0], low)
        total += sum(end - start for start, end in merged[i + 1 : j - 1])
        total += min(merged[j - 1][1], high) - merged[j - 1][0]
    return total


def subtract(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """The time in merged ``a`` and not in merged ``b``."""
    out: list[Interval] = []
    j = 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        cursor, k = start, j
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cursor:
                out.append((cursor, b[k][0]))
            cursor = max(cursor, b[k][1])
            k += 1
        if cursor < end:
            out.append((cursor, end))
    return out


def inside(point: float, merged: Sequence[Interval]) -> bool:
    """Whether ``point`` lies in one of the merged intervals (start included, end not)."""
    i = bisect_right(merged, (point, float("inf"))) - 1
    return i >= 0 and point < merged[i][1]


def starts_in(points: Any, merged: Sequence[Interval]) -> Any:
    """Whether each point (an array) lies in one of the merged intervals (start included, end not), as
    :func:`inside` tells one point."""
    if not merged or not len(points):
        return np.zeros(len(points), dtype=bool)
    bounds = np.array(merged, dtype=np.float64)
    i = np.searchsorted(bounds[:, 0], points, side="right") - 1
    return (i >= 0) & (points < bounds[np.maximum(i, 0), 1])


def outermost(spans: Iterable[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The spans (``(start, end, ...)`` sorted by start, longest first) that lie inside no other."""
    top = []
    covered_until = float("-inf")
    for span in spans:
        if span[0] >= covered_until:
            top.append(span)
            covered_until = span[1]
        else:
            covered_until = max(covered_until, span[1])
    return top
