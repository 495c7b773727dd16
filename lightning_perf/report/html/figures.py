"""
Figures
=======

The pages' Plotly figures, as plain figure dicts (``{"data": [...], "layout": {...}}``, drawn by
:func:`lightning_perf.report.html.document.chart`): per epoch, one line per stage (:func:`epoch_figures`: step
time, data wait, throughput, loss, memory peaks; :func:`flops_figure`), per rank of a distributed run
(:func:`rank_spread_figure`, :func:`rank_figures`), a step's breakdown (:func:`breakdown_figure`) and the top
modules by FLOPs (:func:`modules_figure`). The per-batch chart is in
:mod:`~lightning_perf.report.html.step_figures`.

Bounded: a series holds at most :data:`MAX_EPOCH_POINTS` epochs (:func:`thinned`), so a figure's size does not
grow with the run's length; a per-rank figure holds one epoch.

Every figure has axis titles with units, a legend where it draws more than one series, and hover text. Plotly
is not imported here.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter
from typing import Any

from lightning_perf.records import EpochSummary, RankSummary
from lightning_perf.report.html.breakdown import (
    COMMUNICATION,
    CPU_EXECUTION,
    DATA_LOADING,
    DEVICE_BUSY,
    OTHER,
)
from lightning_perf.units import MIB, si_scale

MAX_EPOCH_POINTS = 500
"""Points per series of a per-epoch chart: a longer run's epochs are thinned to this many, evenly spaced, the
first and the latest kept (500 points are still a smooth line at a chart's width; a 100,000-epoch run's
figures stay as small as a 500-epoch run's)."""

# The parts of a step's communication bar (report.html.windows.communication_html).
EXPOSED_COMMUNICATION = "communication, exposed"
OVERLAPPED_COMMUNICATION = "communication, overlapped with compute"
NO_COMMUNICATION = "no communication"
PART_COLOURS = {
    DEVICE_BUSY: "#286ec8",
    COMMUNICATION: "#7b3fb5",
    DATA_LOADING: "#e6781e",
    CPU_EXECUTION: "#2e9e5b",
    OTHER: "#9aa3b2",
    EXPOSED_COMMUNICATION: "#7b3fb5",
    OVERLAPPED_COMMUNICATION: "#c3a5e0",
    NO_COMMUNICATION: "#d5d9e0",
}
STAGE_COLOURS = {"train": "#286ec8", "validate": "#e6781e", "test": "#2e9e5b", "predict": "#7b3fb5"}
"""One colour per stage in the per-epoch charts; the line's dash tells the series of a stage apart."""

TITLE_PLACE: dict[str, Any] = {
    "x": 0,
    "xref": "paper",
    "xanchor": "left",
    "y": 0.98,
    "yref": "container",
    "yanchor": "top",
    "font": {"size": 14},
}
"""Every chart's title: at the top left, over the plot's left edge, clear of Plotly's mode bar (top right)."""

Getter = Callable[[EpochSummary], "float | None"]


def thinned(count: int, limit: int = MAX_EPOCH_POINTS) -> list[int]:
    """At most ``limit`` indices of ``range(count)``, evenly spaced, the first and the last among them."""
    if count <= limit:
        return list(range(count))
    if limit < 2:
        return [count - 1]
    step = (count - 1) / (limit - 1)
    return sorted({round(i * step) for i in range(limit)})


def _round(value: float | None, digits: int = 4) -> float | None:
    """A value for a figure, to four significant digits (shorter JSON; hover shows fewer)."""
    if value is None:
        return None
    return float(f"{value:.{digits}g}")


def _layout(title: str, xtitle: str, ytitle: str, **extra: Any) -> dict[str, Any]:
    return {
        "title": {"text": title, **TITLE_PLACE},
        "xaxis": {"title": {"text": xtitle}},
        "yaxis": {"title": {"text": ytitle}},
        "legend": {"orientation": "h", "y": -0.32, "yanchor": "top"},  # under the x axis's title
        "hovermode": "closest",
        **extra,
    }


def _line(
    name: str, xs: list[Any], ys: list[float | None], hover: str, dash: str = "solid", colour: str | None = None
) -> dict[str, Any]:
    return {
        "type": "scatter",
        "mode": "lines+markers" if len(xs) <= 60 else "lines",
        "name": name,
        "x": xs,
        "y": ys,
        "line": {"dash": dash, **({"color": colour} if colour else {})},
        "connectgaps": False,
        "hovertemplate": f"epoch %{{x}}: {hover}<extra>{name}</extra>",
    }


def epoch_series(
    stages: Mapping[str, Sequence[EpochSummary]],
    get: Getter,
    *,
    name: str,
    hover: str,
    scale: float = 1.0,
    dash: str = "solid",
) -> list[dict[str, Any]]:
    """One line per stage of ``get(epoch) * scale`` over its epochs (thinned), named ``"<stage> <name>"``, in the
    stage's colour (:data:`STAGE_COLOURS`) and ``dash``; a stage whose every value is ``None`` is left out."""
    lines = []
    for stage, epochs in stages.items():
        kept = [epochs[i] for i in thinned(len(epochs))]
        values = [get(e) for e in kept]
        if all(v is None for v in values):
            continue
        ys = [None if v is None else _round(v * scale) for v in values]
        label = f"{stage} {name}".strip()
        lines.append(_line(label, [e.epoch for e in kept], ys, hover, dash, STAGE_COLOURS.get(stage)))
    return lines


def _figure(
    data: list[dict[str, Any]], title: str, ytitle: str, *, from_zero: bool = True, **extra: Any
) -> dict[str, Any] | None:
    """A per-epoch figure of ``data`` (``None`` without any): whole epochs on its x axis, from the first epoch
    to the last with half an epoch either side (one epoch: a single tick, its dot in the middle), and, where
    ``from_zero``, a y axis from 0 (times, shares, rates and sizes; not a loss)."""
    if not data:
        return None
    xtitle = "epoch (validation: its run)" if any("validate" in str(d.get("name")) for d in data) else "epoch"
    layout = _layout(title, xtitle, ytitle, **extra)
    xs = [x for d in data for x in d["x"]]
    low, high = min(xs), max(xs)
    pad = max(0.5, (high - low) * 0.02)  # half an epoch, or 2% of a long run's span
    layout["xaxis"].update({"range": [low - pad, high + pad], "tickformat": "d"})
    if high - low <= 20:
        layout["xaxis"].update({"dtick": 1, "tick0": 0})
    if from_zero:
        layout["yaxis"]["rangemode"] = "tozero"
    return {"data": data, "layout": layout}


def epoch_figures(stages: Mapping[str, Sequence[EpochSummary]], *, rank_zero: bool = False) -> list[dict[str, Any]]:
    """The per-epoch charts of a run's stages (each stage's epochs in order): step time p50 and p90, data wait
    share, throughput, loss, memory peaks. A chart with no value in any stage is left out. ``rank_zero``:
    the numbers are rank 0's, of a distributed run (the titles say so)."""
    who = " (rank 0)" if rank_zero else ""
    steps = epoch_series(stages, lambda e: e.step_time_p50, name="p50", hover="%{y:.2f} ms", scale=1e3)
    steps += epoch_series(stages, lambda e: e.step_time_p90, name="p90", hover="%{y:.2f} ms", scale=1e3, dash="dot")
    memory = []
    for key, name, dash in (
        ("host_rss_peak", "host RSS peak", "solid"),
        ("cuda_max_allocated", "CUDA max allocated", "dash"),
        ("cuda_max_reserved", "CUDA max reserved", "dot"),
    ):
        memory += epoch_series(stages, attrgetter(key), name=name, hover="%{y:,.0f} MiB", scale=1 / MIB, dash=dash)
    figures = [
        _figure(steps, f"Step time per epoch (p50, p90){who}", "step time (ms)"),
        _figure(
            epoch_series(stages, lambda e: e.data_wait_fraction, name="", hover="%{y:.1f}%", scale=100),
            f"Data wait per epoch{who}",
            "data wait (% of step time)",
        ),
        _figure(
            epoch_series(stages, lambda e: e.throughput, name="", hover="%{y:,.1f} samples/s"),
            f"Throughput per epoch{who}",
            "samples/s",
        ),
        _figure(
            epoch_series(stages, lambda e: e.loss, name="loss", hover="%{y:.4g}"),
            f"Loss per epoch{who}",
            "loss",
            from_zero=False,
        ),
        _figure(memory, f"Memory peaks per epoch{who}", "memory (MiB)"),
    ]
    return [f for f in figures if f is not None]


def flops_figure(stages: Mapping[str, Sequence[EpochSummary]], *, rank_zero: bool = False) -> dict[str, Any] | None:
    """Achieved FLOP/s per epoch and stage, in the SI unit that suits the largest
    (:func:`lightning_perf.units.si_scale`), and MFU (%) where the device's peak is known, on a second axis;
    ``None`` where no epoch's FLOPs were counted."""
    rates = [e.flops_per_second for epochs in stages.values() for e in epochs if e.flops_per_second is not None]
    prefix, factor = si_scale(max(rates, default=0.0))
    unit = f"{prefix}FLOP/s"
    data = epoch_series(stages, lambda e: e.flops_per_second, name=unit, hover=f"%{{y:.3g}} {unit}", scale=1 / factor)
    mfu = epoch_series(stages, lambda e: e.mfu, name="MFU", hover="%{y:.1f}%", scale=100, dash="dot")
    for line in mfu:
        line["yaxis"] = "y2"
    extra: dict[str, Any] = {}
    if mfu:
        extra["yaxis2"] = {"title": {"text": "MFU (%)"}, "overlaying": "y", "side": "right", "rangemode": "tozero"}
    who = " (rank 0)" if rank_zero else ""
    return _figure(data + mfu, f"Achieved FLOP/s per epoch{who}", f"achieved {unit}", **extra)


def rank_spread_figure(stage: str, epochs: Sequence[tuple[int, Sequence[RankSummary]]]) -> dict[str, Any] | None:
    """The spread of the ranks' median step over a stage's epochs: the fastest, the median and the slowest
    rank's (a line each, whatever the world size), the rank named in the hover text. ``epochs``:
    ``(epoch, its ranks)`` in order; ``None`` without a rank's step time."""
    xs: list[int] = []
    fastest: list[tuple[float, int]] = []
    middle: list[float | None] = []
    slowest: list[tuple[float, int]] = []
    for i in thinned(len(epochs)):
        epoch, ranks = epochs[i]
        timed = sorted((r.step_time_p50, r.rank) for r in ranks if r.step_time_p50 is not None)
        if timed:
            xs.append(epoch)
            fastest.append(timed[0])
            middle.append(_round(statistics.median(t for t, _ in timed) * 1e3))
            slowest.append(timed[-1])
    if not xs:
        return None
    data = [
        _rank_line("slowest rank", xs, slowest),
        _line("median over ranks", xs, middle, "%{y:.2f} ms"),
        _rank_line("fastest rank", xs, fastest),
    ]
    return _figure(data, f"{stage}: median step across ranks per epoch", "step time p50 (ms)")


def _rank_line(name: str, xs: list[int], values: list[tuple[float, int]]) -> dict[str, Any]:
    line = _line(name, xs, [_round(t * 1e3) for t, _ in values], "%{y:.2f} ms, %{text}")
    line["text"] = [f"rank {rank}" for _, rank in values]
    return line


def _rank_bars(ranks: Sequence[RankSummary], fields: Sequence[tuple[str, str]], scale: float, hover: str) -> list[Any]:
    data = []
    for key, name in fields:
        values = [getattr(r, key) for r in ranks]
        if all(v is None for v in values):
            continue
        data.append(
            {
                "type": "bar",
                "name": name,
                "x": [r.rank for r in ranks],
                "y": [None if v is None else _round(v * scale) for v in values],
                "hovertemplate": f"rank %{{x}}: {hover}<extra>{name}</extra>",
            }
        )
    return data


def rank_figures(stage: str, epoch: int, ranks: Sequence[RankSummary]) -> list[dict[str, Any]]:
    """A distributed epoch per rank: step time (p50, p90, max), data wait and exposed communication shares,
    memory peaks; a chart with no value is left out."""
    where = f"{stage} epoch {epoch}"
    charts = [
        (
            _rank_bars(
                ranks,
                [("step_time_p50", "p50"), ("step_time_p90", "p90"), ("step_time_max", "max")],
                1e3,
                "%{y:.2f} ms",
            ),
            f"Step time per rank ({where})",
            "step time (ms)",
        ),
        (
            _rank_bars(
                ranks,
                [("data_wait_fraction", "data wait"), ("communication_share", "exposed communication")],
                100,
                "%{y:.1f}% of the step",
            ),
            f"Data wait, exposed comm. per rank ({where})",
            "share of step time (%)",
        ),
        (
            _rank_bars(
                ranks,
                [
                    ("host_rss_peak", "host RSS peak"),
                    ("cuda_max_allocated", "CUDA max allocated"),
                    ("cuda_max_reserved", "CUDA max reserved"),
                ],
                1 / MIB,
                "%{y:,.0f} MiB",
            ),
            f"Memory peaks per rank ({where})",
            "memory (MiB)",
        ),
    ]
    return [
        {
            "data": data,
            "layout": _layout(
                title, "rank", ytitle, barmode="group", xaxis={"title": {"text": "rank"}, "type": "category"}
            ),
        }
        for data, title, ytitle in charts
        if data
    ]


def breakdown_figure(rows: Sequence[tuple[str, Sequence[tuple[str, float]]]], *, title: str) -> dict[str, Any]:
    """Stacked horizontal bars of step breakdowns (:func:`~lightning_perf.report.html.breakdown.step_breakdown`),
    one bar per ``(label, parts)`` row (a window, or a rank's trace), one colour per part (ms)."""
    labels = list(dict.fromkeys(label for _, parts in rows for label, _ in parts))
    data = []
    for part in labels:
        values = [dict(parts).get(part) for _, parts in rows]
        totals = [sum(v for _, v in parts) for _, parts in rows]
        data.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": part,
                "y": [name for name, _ in rows],
                "x": [None if v is None else _round(v * 1e3) for v in values],
                "customdata": [
                    None if v is None or t <= 0 else round(100 * v / t, 1) for v, t in zip(values, totals, strict=True)
                ],
                "marker": {"color": PART_COLOURS.get(part, "#888888")},
                "hovertemplate": f"{part}: %{{x:.2f}} ms (%{{customdata}}% of the step)<extra>%{{y}}</extra>",
            }
        )
    height = max(210, 120 + 40 * len(rows))  # room for the legend's five parts beside a single bar
    layout = _layout(title, "mean time per step (ms)", "", barmode="stack", height=height, legend={})  # at the right
    layout["yaxis"] = {"title": {"text": "trace" if len(rows) > 1 else ""}, "automargin": True, "type": "category"}
    return {"data": data, "layout": layout}


def modules_figure(modules: Sequence[tuple[str, float]]) -> dict[str, Any]:
    """The top modules by share of a batch's FLOPs, as horizontal bars (largest on top)."""
    shown = list(reversed(modules))
    return {
        "data": [
            {
                "type": "bar",
                "orientation": "h",
                "name": "share of the forward's FLOPs",
                "x": [_round(100 * share) for _, share in shown],
                "y": [name for name, _ in shown],
                "hovertemplate": "%{y}: %{x:.1f}% of the batch's FLOPs<extra></extra>",
            }
        ],
        "layout": {
            **_layout("Modules by share of the forward's FLOPs", "share of the forward's FLOPs (%)", "module"),
            "yaxis": {"title": {"text": "module"}, "automargin": True, "type": "category"},
            "height": 140 + 22 * len(shown),
        },
    }
