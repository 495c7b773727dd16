"""
The run's charts
================

The run page's charts section: per stage, the per-batch step time of the epochs whose batches the report
keeps (:mod:`~lightning_perf.report.html.step_figures`); per epoch, step time, data wait, throughput, loss and
memory peaks (:func:`~lightning_perf.report.html.figures.epoch_figures`); in a distributed run, per rank
(:func:`~lightning_perf.report.html.figures.rank_spread_figure`, the latest distributed epoch's
:func:`~lightning_perf.report.html.figures.rank_figures` and its per-rank table).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from lightning_perf.records import EpochSummary, RankSummary, WindowRecord
from lightning_perf.report.html.document import Cell, chart, esc, number_cell, table, value_cells
from lightning_perf.report.html.figures import MAX_EPOCH_POINTS, epoch_figures, rank_figures, rank_spread_figure
from lightning_perf.report.html.step_figures import (
    MAX_STEP_EPOCHS,
    STALL_FACTOR,
    STALL_MIN_EXCESS,
    EpochSteps,
    kept_epochs,
    step_figure,
)
from lightning_perf.report.json_report import ReportEpoch
from lightning_perf.units import count, duration, flops_rate, mib, ms, percent

Stages = Mapping[str, Sequence[ReportEpoch]]
"""Each stage's epochs, in order."""


def _step_charts(stages: Stages, windows: Sequence[WindowRecord], *, rank_zero: bool) -> str:
    html = ""
    for stage, epochs in stages.items():
        steps = [s for epoch in epochs if (s := EpochSteps.of(epoch, windows)) is not None]
        if not steps:
            continue
        kept = kept_epochs(steps, {w.epoch for w in windows if w.stage == stage})
        html += chart(step_figure(stage, kept, rank_zero=rank_zero), height=440)
        if len(kept) < len(steps):
            html += (
                f'<p class="note">{stage}: {len(kept)} of the {len(steps)} epochs whose batches the report keeps'
                f" (at most {MAX_STEP_EPOCHS}: the latest, the first, those with a profiler window, then the"
                " newest).</p>"
            )
    if not html:
        return (
            '<p class="note">The report keeps no per-batch times (a report written before they were kept, or a'
            " run with no batch): the charts below are per epoch.</p>"
        )
    ranks = " Rank 0's batches: every rank runs the same batches in step." if rank_zero else ""
    return (
        '<p class="note">Each bar is one batch: the wait for the DataLoader (orange) under the rest of the step'
        " (blue). Shaded: batches during which the profiler was on (slower, and left out of the epoch's"
        " figures): darker, those a profiler window recorded; lighter, the rest (the profiler's warm-up, the"
        " batch whose FLOPs were counted). Triangles: the batch right after a profiled stretch, which holds a"
        " window's close (the profiler stopping and its trace being saved): its spike is no stall. Stars: batches"
        f" during which <code>torch.compile</code> compiled. Crosses: stall spikes, a batch at least"
        f" {STALL_FACTOR:g} times the epoch's median step and {esc(duration(STALL_MIN_EXCESS))} above it"
        " (the <code>step_time_unstable</code> rule's spike). The report keeps every batch of epochs 0, 1, 2,"
        f" 4, 8, ..., of those with a profiler window and of each stage's latest; pick one in the menu.{ranks}</p>"
        + html
    )


# The per-rank table's columns after the rank: header, RankSummary field, formatter.
RANK_COLUMNS: tuple[tuple[str, str, Callable[[float], str]], ...] = (
    ("step p50", "step_time_p50", ms),
    ("step p90", "step_time_p90", ms),
    ("step max", "step_time_max", ms),
    ("data wait", "data_wait_fraction", percent),
    ("CPU wait", "cpu_wait_share", percent),
    ("samples/s", "throughput", count),
    ("FLOP/s", "flops_per_second", flops_rate),
    ("comm. exposed", "communication_share", percent),
    ("host peak", "host_rss_peak", mib),
    ("CUDA max allocated", "cuda_max_allocated", mib),
    ("CUDA max reserved", "cuda_max_reserved", mib),
)


def rank_table(ranks: Sequence[RankSummary]) -> str:
    """The per-rank table of a distributed epoch (or of a directory of ranks' traces), sortable; columns
    without a value for any rank left out."""
    columns = [c for c in RANK_COLUMNS if any(getattr(r, c[1]) is not None for r in ranks)]
    rows: list[list[Cell | str]] = []
    for r in ranks:
        rows.append([number_cell(r.rank), *value_cells(r, columns)])
    headers = ["rank", *(c[0] for c in columns)]
    return table(headers, rows, sortable=True, numeric=[True] * len(headers))


def _rank_charts(stages: Stages) -> str:
    html = ""
    for stage, epochs in stages.items():
        distributed = [(e.summary.epoch, e.ranks) for e in epochs if e.ranks]
        if not distributed:
            continue
        html += f"<h3>{esc(stage)}: per rank</h3>"
        spread = rank_spread_figure(stage, distributed)
        epoch, ranks = distributed[-1]
        figures = ([spread] if spread is not None and len(distributed) > 1 else []) + rank_figures(stage, epoch, ranks)
        html += '<div class="grid">' + "".join(chart(f) for f in figures) + "</div>"
        html += f'<p class="note">{esc(stage)} epoch {epoch}, every rank (click a header to sort):</p>'
        html += rank_table(ranks)
    return html


def _epoch_note(stages: Stages) -> str:
    interrupted = [
        f"{e.summary.stage} {e.summary.epoch}" for epochs in stages.values() for e in epochs if e.summary.interrupted
    ]
    if not interrupted:
        return ""
    shown = ", ".join(interrupted[:10]) + (" ..." if len(interrupted) > 10 else "")
    return f'<p class="note">Interrupted (summarized as far as they ran): {esc(shown)}.</p>'


def _loss_note(summaries: Mapping[str, Sequence[EpochSummary]]) -> str:
    if not summaries or any(e.loss is not None for epochs in summaries.values() for e in epochs):
        return ""
    return (
        '<p class="note">No loss: the step returned none (manual optimization, or a dict without'
        " <code>'loss'</code>).</p>"
    )


def charts_html(stages: Stages, windows: Sequence[WindowRecord], *, world_size: int = 1) -> str:
    """The charts section's body; ``world_size`` above 1: the per-batch and per-epoch charts are rank 0's
    (their titles say so), the per-rank ones every rank's."""
    rank_zero = world_size > 1
    summaries: dict[str, list[EpochSummary]] = {stage: [e.summary for e in epochs] for stage, epochs in stages.items()}
    summaries = {stage: epochs for stage, epochs in summaries.items() if epochs}
    html = "<h3>Step time per batch</h3>" + _step_charts(stages, windows, rank_zero=rank_zero)
    figures = epoch_figures(summaries, rank_zero=rank_zero)
    if figures:
        total = sum(len(epochs) for epochs in summaries.values())
        html += "<h3>Per epoch</h3>"
        html += (
            f'<p class="note">{count(total)} stage epochs{" of rank 0 (every rank: below)" if rank_zero else ""};'
            f" a longer run's lines are thinned to {MAX_EPOCH_POINTS} points each.</p>"
        )
        html += _epoch_note(stages) + _loss_note(summaries)
        html += '<div class="grid">' + "".join(chart(f) for f in figures) + "</div>"
    else:
        html += '<p class="note">No epoch was measured.</p>'
    html += _rank_charts(stages)
    return html
