"""
Per-batch step-time charts
==========================

The stacked bars of every measured batch of a stage's epochs (data wait at the bottom, compute on top), from
the ``steps`` the report keeps for some epochs (see :mod:`lightning_perf.report.json_report`): one Plotly
figure per stage (:func:`step_figure`), its epochs picked from a dropdown, the latest shown first, with

- the batches left out of the epoch's figures because the profiler was on shaded: those a profiler window of
  the report recorded darker (named after the window), the rest of a profiled stretch (the profiler's
  warm-up, the batch whose FLOPs were counted) lighter; in an epoch without a window in the report, the
  stretches in one shade that says both;
- the batch right after a profiled stretch marked with a triangle: it holds the window's close (the profiler
  stopping and its trace being saved, the window's "paused at its close"), so its spike is no stall;
- the batches during which ``torch.compile`` compiled marked with a star;
- stall spikes marked with a cross: a bar at least :data:`STALL_FACTOR` times the epoch's median step and at
  least :data:`STALL_MIN_EXCESS` above it, the spike of the ``step_time_unstable`` rule
  (:mod:`lightning_perf.diagnose.thresholds`), among the bars neither profiled, closing a window nor compiling.

Bounded: a stage's figure holds at most :data:`MAX_STEP_EPOCHS` epochs (:func:`kept_epochs`), each of at most
the report's 2,000 bars (consecutive batches merged into one bar beyond that), times rounded to the
microsecond: at most about 40 KB of figure data per epoch, 640 KB per stage.

Plain figure dicts: Plotly is not imported here.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lightning_perf.diagnose.thresholds import STEP_MIN_SPIKE, STEP_SPIKE_FACTOR
from lightning_perf.records import WindowRecord
from lightning_perf.report.html.figures import TITLE_PLACE
from lightning_perf.report.json_report import ReportEpoch

DATA_WAIT_COLOUR = "#e6781e"  # report/charts.py's orange (230, 120, 30): the TensorBoard image's colours
COMPUTE_COLOUR = "#286ec8"  # its blue (40, 110, 200)
COMPILE_COLOUR = "#7b3fb5"
STALL_COLOUR = "#b3261e"
CLOSE_COLOUR = "#5b6474"
WINDOW_FILL = "rgba(90, 100, 120, 0.24)"  # a window's recorded batches
LEFT_OUT_FILL = "rgba(90, 100, 120, 0.09)"  # the rest of a profiled stretch: lighter
PROFILED_FILL = "rgba(90, 100, 120, 0.16)"  # a stretch of an epoch without a window in the report

PROFILED = "profiler on (window, its warm-up, or the FLOP count): left out of the epoch's figures"
LEFT_OUT = "left out (profiler warm-up or FLOP count)"
CLOSE = "window close: the trace being saved"
AFTER = "after the profiler or the FLOP count: not a stall"

STALL_FACTOR = STEP_SPIKE_FACTOR
"""A stall spike is a bar this many times the epoch's median step or more: ``step_time_unstable``'s spike."""
STALL_MIN_EXCESS = STEP_MIN_SPIKE
"""...and this many seconds above it (sub-millisecond jitter of a shared host is no stall)."""
MAX_STEP_EPOCHS = 16
"""Epochs per stage in the per-batch chart: the latest, the first, those with a profiler window (newest
first), then the newest of the rest. The report keeps epochs 0, 1, 2, 4, ..., 256 (ten), those with a window
and the latest: sixteen show them all for a run of up to about 500 epochs with a few windows, and keep a
stage's figure under about 640 KB at 2,000 bars each."""
TRACES_PER_EPOCH = 5
"""The figure's traces for one epoch: data wait and compute bars; compile, window-close and stall markers."""


@dataclass(frozen=True)
class Recorded:
    """A profiler window's recorded batches, as the chart shades them.

    Attributes:
        name: The window's directory name.
        first: Its first recorded batch.
        last: Its last recorded batch.
    """

    name: str
    first: int
    last: int

    @classmethod
    def of(cls, window: WindowRecord) -> Recorded:
        return cls(window.name, window.first_batch, window.last_batch)


@dataclass(frozen=True)
class EpochSteps:
    """An epoch's per-batch step split (:class:`~lightning_perf.records.StepSplit`), with its epoch.

    Attributes:
        epoch: The stage's epoch.
        data_wait: Seconds per bar.
        compute: Seconds per bar.
        per_bar: Consecutive batches each bar stands for (their mean).
        profiled: Batch ranges (inclusive) during which the profiler was on (windows, their warm-up, the
            FLOP count): left out of the epoch's figures.
        compiled: Batches during which ``torch.compile`` compiled.
        interrupted: The epoch did not end.
        windows: The report's profiler windows of this epoch (their recorded batches).
    """

    epoch: int
    data_wait: tuple[float, ...]
    compute: tuple[float, ...]
    per_bar: int = 1
    profiled: tuple[tuple[int, int], ...] = ()
    compiled: tuple[int, ...] = ()
    interrupted: bool = False
    windows: tuple[Recorded, ...] = ()

    @classmethod
    def of(cls, epoch: ReportEpoch, windows: Sequence[WindowRecord] = ()) -> EpochSteps | None:
        """A report epoch's step split, with ``windows`` of its stage epoch; ``None`` where the report does
        not keep it, or it has no batch."""
        split = epoch.steps
        if split is None or not split.compute:
            return None
        s = epoch.summary
        return cls(
            epoch=s.epoch,
            data_wait=split.data_wait,
            compute=split.compute,
            per_bar=max(split.per_bar, 1),
            profiled=split.profiled,
            compiled=split.compiled,
            interrupted=s.interrupted,
            windows=tuple(Recorded.of(w) for w in windows if (w.stage, w.epoch) == (s.stage, s.epoch)),
        )

    def steps(self) -> list[float]:
        """Each bar's step time (data wait + compute), in seconds."""
        return [w + c for w, c in zip(self.data_wait, self.compute, strict=True)]

    def bar_of(self, batch: int) -> int:
        return batch // self.per_bar

    def center(self, bar: int) -> float:
        """The x of a bar: the middle of the batches it stands for."""
        return bar * self.per_bar + (self.per_bar - 1) / 2

    def closes(self) -> dict[int, str]:
        """The bars of the batches right after each profiled stretch, with what they hold: a window's close
        (:data:`CLOSE`) after a stretch holding one of :attr:`windows`, or, after one without (the FLOP
        count; or any stretch of an epoch whose windows the report does not hold), :data:`AFTER`."""
        bars: dict[int, str] = {}
        for first, last in self.profiled:
            bar = self.bar_of(last + 1)
            if bar < len(self.compute):
                holds = any(first <= w.first and w.last <= last for w in self.windows)
                bars[bar] = CLOSE if holds else bars.get(bar, AFTER)
        return bars

    def excluded(self) -> set[int]:
        """Bars holding a profiled, a window-closing or a compiling batch."""
        bars = {self.bar_of(b) for b in self.compiled} | set(self.closes())
        for first, last in self.profiled:
            bars.update(range(self.bar_of(first), self.bar_of(last) + 1))
        return bars

    def stalls(self) -> list[int]:
        """The bars that are stall spikes (see the module's docstring)."""
        steps, excluded = self.steps(), self.excluded()
        plain = [s for i, s in enumerate(steps) if i not in excluded] or steps
        median = statistics.median(plain)
        return [
            i
            for i, s in enumerate(steps)
            if i not in excluded and s >= STALL_FACTOR * median and s - median >= STALL_MIN_EXCESS
        ]


def kept_epochs(
    epochs: Sequence[EpochSteps], window_epochs: set[int], limit: int = MAX_STEP_EPOCHS
) -> list[EpochSteps]:
    """At most ``limit`` of a stage's ``epochs`` (see :data:`MAX_STEP_EPOCHS`), in epoch order."""
    if len(epochs) <= limit:
        return list(epochs)
    newest_first = sorted(epochs, key=lambda e: -e.epoch)
    order = [newest_first[0], newest_first[-1]]
    order += [e for e in newest_first if e.epoch in window_epochs]
    order += newest_first
    kept: dict[int, EpochSteps] = {}
    for e in order:
        if len(kept) == limit:
            break
        kept.setdefault(e.epoch, e)
    return sorted(kept.values(), key=lambda e: e.epoch)


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)  # to the microsecond: shorter JSON, nothing a person reads lost


def _epoch_traces(e: EpochSteps, visible: bool) -> list[dict[str, Any]]:
    """The :data:`TRACES_PER_EPOCH` traces of one epoch: data wait and compute bars, compile, window-close
    and stall markers."""
    label = f"epoch {e.epoch}"
    batches = "batch %{x}" if e.per_bar == 1 else f"batches around %{{x}} (mean of {e.per_bar})"
    bars: dict[str, Any] = {"type": "bar", "x0": (e.per_bar - 1) / 2, "dx": e.per_bar, "visible": visible}
    if e.per_bar > 1:
        bars["width"] = e.per_bar
    steps = e.steps()
    compiled = sorted({e.bar_of(b) for b in e.compiled if e.bar_of(b) < len(steps)})
    closes = e.closes()
    close = _markers(e, sorted(closes), steps, "window close (trace saved)", "triangle-down", CLOSE_COLOUR, visible)
    close["text"] = [closes[i] for i in sorted(closes)]
    close["hovertemplate"] = f"batch %{{x}}: %{{text}}<br>step %{{y:.2f}} ms<extra>{label}</extra>"
    return [
        {
            **bars,
            "name": "data wait",
            "y": [_ms(v) for v in e.data_wait],
            "marker": {"color": DATA_WAIT_COLOUR},
            "hovertemplate": f"{batches}<br>data wait %{{y:.2f}} ms<extra>{label}</extra>",
        },
        {
            **bars,
            "name": "compute",
            "y": [_ms(v) for v in e.compute],
            "marker": {"color": COMPUTE_COLOUR},
            "hovertemplate": f"{batches}<br>compute %{{y:.2f}} ms<extra>{label}</extra>",
        },
        _markers(e, compiled, steps, "torch.compile compiled", "star", COMPILE_COLOUR, visible),
        close,
        _markers(e, e.stalls(), steps, f"stall (>= {STALL_FACTOR:g}x median)", "x", STALL_COLOUR, visible),
    ]


def _markers(
    e: EpochSteps, bars: list[int], steps: list[float], name: str, symbol: str, colour: str, visible: bool
) -> dict[str, Any]:
    return {
        "type": "scatter",
        "mode": "markers",
        "name": name,
        "x": [e.center(i) for i in bars],
        "y": [_ms(steps[i]) for i in bars],
        "marker": {"symbol": symbol, "size": 10, "color": colour},
        "visible": visible,
        "showlegend": bool(bars),
        "hovertemplate": f"batch %{{x}}: {name}<br>step %{{y:.2f}} ms<extra>epoch {e.epoch}</extra>",
    }


def _stretches(e: EpochSteps) -> list[tuple[int, int, str, str]]:
    """The shaded batch ranges: ``(first, last, name, fill)``, a window's recorded batches apart from the
    rest of its stretch (see the module's docstring)."""
    if not e.windows:
        return [(first, last, PROFILED, PROFILED_FILL) for first, last in e.profiled]
    shaded = []
    for first, last in e.profiled:
        at = first
        for w in sorted((w for w in e.windows if first <= w.first and w.last <= last), key=lambda w: w.first):
            if w.first > at:
                shaded.append((at, w.first - 1, LEFT_OUT, LEFT_OUT_FILL))
            shaded.append((w.first, w.last, f"profiler window {w.name}", WINDOW_FILL))
            at = w.last + 1
        if at <= last:
            shaded.append((at, last, LEFT_OUT, LEFT_OUT_FILL))
    return shaded


def _shapes(e: EpochSteps) -> list[dict[str, Any]]:
    """The profiled stretches, shaded (one legend entry per name)."""
    shapes, named = [], set()
    for first, last, name, fill in _stretches(e):
        shapes.append(
            {
                "type": "rect",
                "xref": "x",
                "yref": "paper",
                "x0": first - 0.5,
                "x1": last + 0.5,
                "y0": 0,
                "y1": 1,
                "fillcolor": fill,
                "line": {"width": 0},
                "layer": "below",
                "name": name,
                "showlegend": name not in named,
            }
        )
        named.add(name)
    return shapes


def _title(stage: str, e: EpochSteps, rank_zero: bool) -> str:
    merged = "" if e.per_bar == 1 else f", each bar the mean of {e.per_bar} batches"
    who = " (rank 0)" if rank_zero else ""
    return f"{stage}{who}: step time per batch, epoch {e.epoch}{' (interrupted)' if e.interrupted else ''}{merged}"


def _bargap(e: EpochSteps) -> float:
    return 0 if len(e.compute) > 200 else 0.1  # beyond 200 bars, gaps would read as a pale hatching


def step_figure(stage: str, epochs: Sequence[EpochSteps], *, rank_zero: bool = False) -> dict[str, Any]:
    """The per-batch chart of a stage: ``epochs`` (at least one, as :func:`kept_epochs` picks them) behind a
    dropdown, the last of them shown first; ``rank_zero``: the times are rank 0's, of a distributed run."""
    if not epochs:
        raise ValueError("step_figure needs at least one epoch with steps")
    shown = len(epochs) - 1
    data: list[dict[str, Any]] = []
    for i, e in enumerate(epochs):
        data += _epoch_traces(e, visible=i == shown)
    layout: dict[str, Any] = {
        "title": {"text": _title(stage, epochs[shown], rank_zero), **TITLE_PLACE},
        "barmode": "stack",
        "bargap": _bargap(epochs[shown]),
        "xaxis": {"title": {"text": "batch"}},
        "yaxis": {"title": {"text": "step time (ms)"}, "rangemode": "tozero"},
        "legend": {"orientation": "h", "y": -0.26, "yanchor": "top"},  # under the x axis's title
        "margin": {"l": 60, "r": 20, "t": 40, "b": 110},  # room for the legend's few rows
        "shapes": _shapes(epochs[shown]),
        "hovermode": "closest",
    }
    if len(epochs) > 1:
        buttons = []
        for i, e in enumerate(epochs):
            visible = [j == i for j in range(len(epochs)) for _ in range(TRACES_PER_EPOCH)]
            buttons.append(
                {
                    "label": f"epoch {e.epoch}",
                    "method": "update",
                    "args": [
                        {"visible": visible},
                        {"shapes": _shapes(e), "title.text": _title(stage, e, rank_zero), "bargap": _bargap(e)},
                    ],
                }
            )
        # Under the title, at the left: clear of the title at any width, and of Plotly's mode bar (top right).
        layout["updatemenus"] = [
            {"buttons": buttons, "active": shown, "x": 0, "xanchor": "left", "y": 1.01, "yanchor": "bottom"}
        ]
        layout["margin"] = {**layout["margin"], "t": 78}  # and room for the menu
    return {"data": data, "layout": layout}
