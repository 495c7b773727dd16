"""
Step-time charts
================

A per-epoch picture of where each training step's time went: a stacked bar chart, one bar per batch in
order, with the time spent waiting for the DataLoader at the bottom (orange) and the rest of the step,
compute, on top (blue). A run that is starved for data shows tall orange bars; a run whose loader keeps
up shows thin orange slivers under blue ones; a periodic stall (a worker restarting, a checkpoint, a slow
shard) shows as a regular pattern of tall bars.

:func:`step_split_image` returns the chart as a ``uint8`` array of shape ``(height, width, 3)``, ready for
``SummaryWriter.add_image(tag, image, step, dataformats="HWC")``. There is no font to draw text with, so
the image has no axis labels or legend; :func:`step_split_caption` gives the one-line markdown caption
that reads it (colours, number of batches, what the full height stands for, median step time and the
data-wait share), to be written beside it with ``add_text``.

How the chart is drawn:

* the full height of the plot area stands for the 99th percentile of the bars' step times (the largest
  bar when there are at most 100), so that one outlier does not flatten the rest; the few taller bars are
  clipped at the top and marked with a small red cap above the plot area;
* light grey gridlines mark 25, 50, 75 and 100% of that scale, and a grey baseline marks zero;
* bars share the width equally, at least 1 px each; they are 1 px apart when there is room for bars of
  2 px or more (thinner bars with gaps would read as a pale hatching, so they touch instead); when there
  are more batches than ``max_width`` pixels, consecutive batches are merged into one bar (the mean of
  each part) so the image is never wider than ``max_width``.

Non-finite and negative times (a missing measurement, a clock that went backwards) count as 0. Everything
is vectorised numpy: a 200 x 800 chart takes about 2 ms.

This module imports neither torch nor lightning.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lightning_perf.units import count, duration, percent

DATA_WAIT_COLOUR = (230, 120, 30)
"""Orange: the part of a step spent waiting for the next batch."""
COMPUTE_COLOUR = (40, 110, 200)
"""Blue: the rest of the step."""
CLIP_COLOUR = (210, 30, 45)
"""Red: the cap above a bar taller than the scale, which was clipped."""
BACKGROUND_COLOUR = (255, 255, 255)
GRID_COLOUR = (226, 226, 226)
BASELINE_COLOUR = (150, 150, 150)

SCALE_PERCENTILE = 99.0
"""The percentile of the bars' step times that the full height of the plot area stands for."""
GRID_FRACTIONS = (0.25, 0.5, 0.75, 1.0)

_CAP_HEIGHT = 3  # rows of the red cap over a clipped bar
_CAP_MIN_WIDTH = 5  # a cap over a thinner bar overhangs it on both sides, so that it can be seen
_TOP_MARGIN = _CAP_HEIGHT + 1  # rows above the plot area: one blank, then room for the cap
_MIN_HEIGHT = _TOP_MARGIN + 4  # margin, at least 3 rows of plot area, and the baseline

# Pixel classes of the rendered image, and their colours (row i of _PALETTE is class i).
_BACKGROUND, _GRID, _BASELINE, _DATA_WAIT, _COMPUTE, _CLIP = range(6)
_PALETTE = np.array(
    [BACKGROUND_COLOUR, GRID_COLOUR, BASELINE_COLOUR, DATA_WAIT_COLOUR, COMPUTE_COLOUR, CLIP_COLOUR], dtype=np.uint8
)


@dataclass(frozen=True)
class _Bars:
    """What both the image and its caption are drawn from.

    Attributes:
        data_wait: Per-batch data-wait times in seconds, sanitised (non-finite and negative set to 0).
        compute: Per-batch compute times in seconds, sanitised likewise.
        bar_data_wait: Per-bar data-wait times: the mean over the batches merged into each bar.
        bar_compute: Per-bar compute times, likewise.
        per_bar: How many consecutive batches each bar stands for (the last bar may stand for fewer).
        bar_width: Width of each bar in pixels.
        gap: Pixels between bars, 0 or 1.
        scale: The step time in seconds that the full height of the plot area stands for.
        clipped: How many bars are taller than ``scale``.
    """

    data_wait: np.ndarray
    compute: np.ndarray
    bar_data_wait: np.ndarray
    bar_compute: np.ndarray
    per_bar: int
    bar_width: int
    gap: int
    scale: float
    clipped: int

    @property
    def width(self) -> int:
        """Width of the image in pixels."""
        n = len(self.bar_data_wait)
        return n * (self.bar_width + self.gap) - self.gap


def _sanitise(values: Sequence[float], name: str) -> np.ndarray:
    """``values`` as a 1-D float64 array with non-finite and negative entries set to 0."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a sequence of numbers, got an array of shape {array.shape}")
    return np.where(np.isfinite(array) & (array > 0), array, 0.0)


def _bars(data_wait: Sequence[float], compute: Sequence[float], max_width: int) -> _Bars:
    """Sanitises the inputs, merges batches to fit ``max_width`` and picks the bar width, gap and scale.

    Raises:
        ValueError: If the two sequences differ in length or ``max_width`` is below 1.
    """
    if max_width < 1:
        raise ValueError(f"max_width must be at least 1, got {max_width}")
    wait = _sanitise(data_wait, "data_wait")
    comp = _sanitise(compute, "compute")
    if len(wait) != len(comp):
        raise ValueError(f"data_wait and compute differ in length: {len(wait)} != {len(comp)}")
    n = len(wait)
    if n == 0:
        return _Bars(wait, comp, wait, comp, per_bar=1, bar_width=1, gap=0, scale=0.0, clipped=0)

    per_bar = math.ceil(n / max_width)
    if per_bar > 1:
        starts = np.arange(0, n, per_bar)
        counts = np.diff(np.append(starts, n))
        bar_wait = np.add.reduceat(wait, starts) / counts
        bar_comp = np.add.reduceat(comp, starts) / counts
    else:
        bar_wait, bar_comp = wait, comp
    bars = len(bar_wait)

    gap = 1 if (max_width + 1) // bars >= 3 else 0  # a gap only beside bars 2 px wide or more
    bar_width = max(1, (max_width + gap) // bars - gap)

    totals = bar_wait + bar_comp
    # "higher": an actual bar's time, so with at most 100 bars the tallest bar fills the plot area exactly.
    scale = float(np.percentile(totals, SCALE_PERCENTILE, method="higher"))
    if scale <= 0.0:  # over 99% of the bars are empty: scale to the tallest
        scale = float(totals.max())
    clipped = int(np.count_nonzero(totals > scale))
    return _Bars(wait, comp, bar_wait, bar_comp, per_bar, bar_width, gap, scale, clipped)


def step_split_image(
    data_wait: Sequence[float], compute: Sequence[float], *, height: int = 200, max_width: int = 800
) -> np.ndarray:
    """Renders the per-batch split of step time into data wait and compute as a stacked bar chart.

    One bar per batch, in order (or per group of consecutive batches when there are more than
    ``max_width``); its height is the batch's step time, ``data_wait + compute``. The data wait is at the
    bottom in orange, compute on top in blue. The full height of the plot area stands for the 99th
    percentile of the bars' step times; taller bars are clipped and marked with a red cap. Light grey
    gridlines mark 25/50/75/100% of that scale. :func:`step_split_caption` says what the image shows.

    Args:
        data_wait: Seconds each batch's step spent waiting for the data, in batch order.
        compute: Seconds of the rest of each batch's step, in the same order. Non-finite and negative
            times in either count as 0.
        height: Height of the image in pixels: a 4 px margin for the clip caps, the plot area and a 1 px
            baseline. At least 8.
        max_width: The widest the image may be, in pixels. Bars share it: each is at least 1 px wide,
            with a 1 px gap between bars when they can be 2 px or wider, and consecutive batches are
            averaged into one bar when there are more batches than pixels.

    Returns:
        A ``uint8`` array of shape ``(height, width, 3)`` (RGB, for ``add_image(..., dataformats="HWC")``)
        with ``width <= max_width``. With no batches: a white image ``height`` x 1.

    Raises:
        ValueError: If ``data_wait`` and ``compute`` differ in length, ``height`` is below 8 or
            ``max_width`` below 1.
    """
    if height < _MIN_HEIGHT:
        raise ValueError(f"height must be at least {_MIN_HEIGHT}, got {height}")
    bars = _bars(data_wait, compute, max_width)
    if len(bars.bar_data_wait) == 0:
        return np.full((height, 1, 3), 255, dtype=np.uint8)

    baseline = height - 1  # row of the baseline; bars stand on it, rows baseline-1 upwards
    plot_height = baseline - _TOP_MARGIN  # rows of the plot area: _TOP_MARGIN .. baseline-1
    classes = np.full((height, bars.width), _BACKGROUND, dtype=np.uint8)
    for fraction in GRID_FRACTIONS:
        classes[baseline - round(fraction * plot_height), :] = _GRID
    classes[baseline, :] = _BASELINE

    # Bar heights in pixels, data wait first and the whole step second; rounding both cumulative heights
    # (rather than each part) keeps every bar's total height exact.
    if bars.scale > 0.0:
        px_per_second = plot_height / bars.scale
        wait_px = np.rint(np.minimum(bars.bar_data_wait, bars.scale) * px_per_second).astype(np.int64)
        totals = bars.bar_data_wait + bars.bar_compute
        total_px = np.rint(np.minimum(totals, bars.scale) * px_per_second).astype(np.int64)
        clipped = totals > bars.scale
    else:
        wait_px = total_px = np.zeros(len(bars.bar_data_wait), dtype=np.int64)
        clipped = np.zeros(len(bars.bar_data_wait), dtype=bool)

    # Each column's bar (gap columns get -1), then per-pixel class by comparing each row's level above the
    # baseline with the column's part heights: one broadcast over the plot area, no loop.
    pitch = bars.bar_width + bars.gap
    column = np.arange(bars.width)
    bar_of_column = np.where(column % pitch < bars.bar_width, column // pitch, -1)
    in_bar = bar_of_column >= 0
    cols = column[in_bar]
    col_wait = wait_px[bar_of_column[in_bar]]
    col_total = total_px[bar_of_column[in_bar]]
    level = np.arange(baseline - 1, -1, -1)[:, None]  # rows 0 .. baseline-1 as levels above the baseline
    area = classes[:baseline, cols]
    area[level < col_total] = _COMPUTE
    area[level < col_wait] = _DATA_WAIT
    classes[:baseline, cols] = area

    # The caps over clipped bars, in the margin above the plot area; widened to _CAP_MIN_WIDTH over thin bars.
    capped: np.ndarray = np.zeros(bars.width, dtype=bool)
    capped[cols] = clipped[bar_of_column[in_bar]]
    overhang = max(0, (_CAP_MIN_WIDTH - bars.bar_width + 1) // 2)
    if overhang and capped.any():
        padded = np.pad(capped, overhang)
        capped = np.asarray(np.lib.stride_tricks.sliding_window_view(padded, 2 * overhang + 1).any(axis=1))
    classes[_TOP_MARGIN - _CAP_HEIGHT : _TOP_MARGIN, capped] = _CLIP
    return _PALETTE[classes]


def step_split_caption(data_wait: Sequence[float], compute: Sequence[float], *, max_width: int = 800) -> str:
    """The one-line markdown caption for :func:`step_split_image` of the same times.

    It names the colours, the number of batches (and how many were merged into each bar when there were
    more than ``max_width``), the time the full height of the plot area stands for, how many bars were
    clipped, the median step time and the data-wait share: the sum of the data wait over the sum of the
    step times, as a percentage with one decimal rounded down (as every share: :mod:`lightning_perf.units`).

    Args:
        data_wait: Seconds each batch's step spent waiting for the data, as given to the image.
        compute: Seconds of the rest of each step, as given to the image.
        max_width: The ``max_width`` the image was drawn with; it decides the merging and so the scale.

    Returns:
        Markdown text without line breaks, e.g. ``"Step time of 120 batches, one bar each in order:
        **orange** = waiting for data, **blue** = compute. Full height = 41.2 ms (the tallest bar). Median
        step 38.0 ms; data wait 23.4% of step time."`` With no batches: ``"Step time: no batches, nothing
        to chart."``

    Raises:
        ValueError: If ``data_wait`` and ``compute`` differ in length or ``max_width`` is below 1.
    """
    bars = _bars(data_wait, compute, max_width)
    n = len(bars.data_wait)
    if n == 0:
        return "Step time: no batches, nothing to chart."
    batches = f"{count(n)} batch" if n == 1 else f"{count(n)} batches"
    if bars.per_bar == 1:
        layout = "one bar each in order"
    else:
        merged = f"{count(bars.per_bar)} consecutive batches averaged per bar ({count(len(bars.bar_data_wait))} bars)"
        layout = f"in order, {merged}"
    colours = "**orange** = waiting for data, **blue** = compute"

    if bars.scale <= 0.0:
        scale = "Every step took 0 s, so the bars are empty"
    else:
        scale = f"Full height = {duration(bars.scale)}"
        if bars.clipped:
            taller = "1 taller bar" if bars.clipped == 1 else f"{count(bars.clipped)} taller bars"
            scale += f" ({SCALE_PERCENTILE:g}th percentile; {taller} clipped, marked with a red cap)"
        elif len(bars.bar_data_wait) > 1:
            scale += " (the tallest bar)"
    steps = bars.data_wait + bars.compute
    total = float(steps.sum())
    median = f"Median step {duration(float(np.median(steps)))}"
    if total > 0:
        share = f"data wait {percent(float(bars.data_wait.sum()) / total, 1)} of step time"
    else:
        share = "no step time to split"
    return f"Step time of {batches}, {layout}: {colours}. {scale}. {median}; {share}."
