"""
FLOPs and MFU on the run page
=============================

What the run's FLOP count says (``run.flops``, ``run.peak_flops`` and the epochs' ``flops_per_batch``,
``flops_per_second``, ``mfu``): the batches counted, each stage's latest numbers, achieved FLOP/s and MFU per
epoch, and the modules with the largest share of a batch's FLOPs (at most :data:`TOP_MODULES`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lightning_perf.records import EpochSummary
from lightning_perf.report.html.document import Cell, chart, esc, number_cell, table
from lightning_perf.report.html.figures import flops_figure, modules_figure
from lightning_perf.report.json_report import report_profiling, report_top_modules, report_uncounted_ops
from lightning_perf.units import count, flops, flops_rate, percent
from lightning_perf.validation import is_finite

TOP_MODULES = 15
"""Modules in the chart and table: the report keeps the largest modules of the first batch counted; past the
first fifteen, each holds a sliver of a batch's FLOPs."""


HELD_BACK = (
    '<p class="note">Not counted: the profiling budget (<code>profile_budget</code>) held the FLOP count back, after'
    " the run's first profiler window, and the run ended before it had made room (a count costs about what a window"
    " does). A longer run counts them; <code>PerfCallback(profile_budget=None)</code> counts them at once.</p>"
)
"""The section's body for a run whose FLOP count the budget held back (``run.profiling.flops_held``)."""


def _number(value: Any) -> float | None:
    return float(value) if is_finite(value) else None


def _counted(run: Mapping[str, Any]) -> str:
    counts = run.get("flops")
    entries = counts.get("counted") if isinstance(counts, Mapping) else None
    if not isinstance(entries, list):
        return ""
    rows: list[list[Cell | str]] = []
    for entry in entries:
        total = _number(entry.get("flops")) if isinstance(entry, Mapping) else None
        if total is None:
            continue
        samples = _number(entry.get("samples"))
        per_sample = total / samples if samples is not None and samples > 0 else None
        rows.append(
            [
                number_cell(total, flops(total)),
                number_cell(samples, None if samples is None else count(samples)),
                number_cell(per_sample, None if per_sample is None else flops(per_sample)),
                Cell(str(entry.get("shape") or "")),
            ]
        )
    if not rows:
        return ""
    headers = ["FLOPs of the batch (forward and backward)", "samples", "per sample", "batch shape"]
    return "<h3>Batches counted</h3>" + table(headers, rows, numeric=[True, True, True, False])


def _latest(stages: Mapping[str, Sequence[EpochSummary]]) -> str:
    rows: list[list[Cell | str]] = []
    for stage, epochs in stages.items():
        e = ([x for x in epochs if not x.interrupted] or epochs)[-1]  # the latest complete, as the headline
        if e.flops_per_batch is None and e.flops_per_second is None and e.mfu is None:
            continue
        rows.append(
            [
                stage,
                number_cell(e.epoch),
                number_cell(e.flops_per_batch, None if e.flops_per_batch is None else flops(e.flops_per_batch)),
                number_cell(e.flops_per_second, None if e.flops_per_second is None else flops_rate(e.flops_per_second)),
                number_cell(e.mfu, None if e.mfu is None else percent(e.mfu, 1)),
            ]
        )
    if not rows:
        return ""
    headers = ["stage", "epoch", "FLOPs per batch", "achieved FLOP/s", "MFU"]
    return table(headers, rows, numeric=[False, True, True, True, True])


def flops_html(
    run: Mapping[str, Any],
    stages: Mapping[str, Sequence[EpochSummary]],
    *,
    rank_zero: bool = False,
    charts: bool = True,
) -> str | None:
    """The FLOPs and MFU section's body; ``None`` for a run whose FLOPs were not counted, but for a note where the
    profiling budget held the count back. ``rank_zero``: the epochs are rank 0's, of a distributed run;
    ``charts=False``: its tables only."""
    modules = report_top_modules(run)[:TOP_MODULES]
    figure = flops_figure(stages, rank_zero=rank_zero)
    latest, counted = _latest(stages), _counted(run)
    if not (modules or figure or latest or counted):
        return HELD_BACK if (cost := report_profiling(run)) is not None and cost.flops_held else None
    peak = _number(run.get("peak_flops"))
    if peak is not None and peak > 0:
        html = f"<p>Peak: {esc(flops_rate(peak))} per device for the run's dtype (what MFU divides by).</p>"
    else:
        html = (
            "<p class=\"note\">The device's peak FLOP/s is unknown for this run (not in lightning-perf's table,"
            " nor given as <code>peak_flops</code>): no MFU.</p>"
        )
    html += latest
    if figure is not None and charts:
        html += chart(figure)
    html += counted
    if uncounted := report_uncounted_ops(run):
        ops = ", ".join(f"<code>{esc(op)}</code> ({calls} calls)" for op, calls in uncounted)
        html += (
            f'<p class="note">Not counted: {ops}. torch has no FLOP formula for these ops, which do matrix work;'
            " they count 0, so FLOPs, FLOP/s and MFU here are lower bounds.</p>"
        )
    if modules:
        rows = [[Cell(name), number_cell(part, percent(part, 1))] for name, part in modules]
        html += '<h3>Modules by forward FLOPs</h3><div class="grid">'
        if charts:
            bars = modules_figure(modules)
            html += chart(bars, height=bars["layout"]["height"])
        html += table(["module", "share of the forward's FLOPs"], rows, sortable=True, numeric=[False, True]) + "</div>"
    return html
