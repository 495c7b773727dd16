"""
A profiled window on a page
===========================

What one trace shows, as the run page shows each profiler window and the traces page each trace
(:func:`window_body`): the trace's numbers per step (:func:`summary_facts`), the step breakdown of the
PyTorch Profiler tab's Overview as a table and a chart (:func:`breakdown_html`, parts from
:func:`~lightning_perf.report.html.breakdown.step_breakdown`), the operator table (:func:`operator_table`:
sortable, the columns with a value in the window) and the trace's path with how to open it in Perfetto,
Holistic Trace Analysis and TensorBoard (:func:`open_instructions`).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence

from lightning_perf.records import CollectiveStats, OperatorStat, TraceSummary, share
from lightning_perf.report.collectives import collective_rows
from lightning_perf.report.html.breakdown import DESCRIPTIONS, HOST_PARTS, host_scale, step_breakdown
from lightning_perf.report.html.document import Cell, chart, esc, number_cell, table, value_cells
from lightning_perf.report.html.figures import (
    EXPOSED_COMMUNICATION,
    NO_COMMUNICATION,
    OVERLAPPED_COMMUNICATION,
    breakdown_figure,
)
from lightning_perf.report.json_report import OPERATOR_ROWS
from lightning_perf.report.markdown import OPERATOR_COLUMNS
from lightning_perf.summarize.operators import default_sort_key, top_operators
from lightning_perf.units import count, duration, duration_us, percent


def _from_us(microseconds: float) -> str:
    return duration(microseconds * 1e-6)  # the page's one spelling of times: units.duration's (µs, ms, s)


# The operator table's number columns: the markdown table's (headers, fields, formatters), its times in
# units.duration's spelling, as every other time on the page.
COLUMNS = tuple((h, attr, _from_us if f is duration_us else f) for h, attr, f in OPERATOR_COLUMNS)


def summary_facts(s: TraceSummary) -> list[tuple[str, str]]:
    """The trace's numbers per step, as ``(what, value)`` rows; those not measured are left out."""

    def of_step(part: float | None, decimals: int = 0) -> str | None:
        fraction = share(part, s)
        return None if part is None or fraction is None else f"{duration(part)} ({percent(fraction, decimals)})"

    stepped = s.optimizer_time is not None and s.optimizer_time > 0  # no optimizer step: validation, ...
    rows: list[tuple[str, str | None]] = [
        ("device", s.device_name),
        ("steps recorded", count(s.steps)),
        ("mean step", duration(s.step_time)),
        ("device busy", of_step(s.device_busy)),
        ("kernels per step", None if s.kernels_per_step is None else count(s.kernels_per_step)),
        ("median kernel", None if s.median_kernel_time is None else duration(s.median_kernel_time)),
        ("host operators per step", count(s.ops_per_step)),
        ("median host operator", duration(s.median_op_time)),
        ("in the DataLoader", of_step(s.dataloader_time)),
        ("in the optimizer step", of_step(s.optimizer_time) if stepped else None),
        ("of which the update", of_step(s.optimizer_update_time) if stepped else None),
        ("outside torch operators", of_step(s.framework_time)),
        ("host-to-device copies, exposed", of_step(s.h2d_exposed_time)),
        ("synchronizations per step", None if s.syncs_per_step is None else f"{s.syncs_per_step:.1f}"),
        ("communication", of_step(s.communication_time)),
        ("communication, exposed", of_step(s.communication_exposed_time)),
        ("compiled regions", of_step(s.compiled_time)),
        ("dynamo guard checks", of_step(s.guard_time, 1)),
    ]
    return [(name, value) for name, value in rows if value is not None]


def breakdown_html(summary: TraceSummary, *, title: str, with_chart: bool = True) -> str:
    """The step breakdown: a table (part, time per step, share, what it holds), a note where the host's parts
    are scaled (:func:`~lightning_perf.report.html.breakdown.host_scale`) and, ``with_chart``, a stacked bar."""
    parts = step_breakdown(summary)
    total = summary.step_time
    scale = host_scale(summary)
    scaled = " (scaled: see below)" if scale is not None else ""
    rows: list[list[Cell | str]] = [
        [
            Cell(part),
            number_cell(seconds, duration(seconds)),
            number_cell(seconds / total if total > 0 else None, percent(seconds / total, 1) if total > 0 else None),
            Cell(DESCRIPTIONS[part] + (scaled if part in HOST_PARTS else "")),
        ]
        for part, seconds in parts
    ]
    html = table(["part", "per step", "share", "what it holds"], rows, numeric=[False, True, True, False])
    if scale is not None:
        idle = "no kernel ran on the device" if summary.device_busy is not None else "no collective ran"
        html += (
            f'<p class="note">Each instant of a step counts once. The host\'s three parts are the time {idle}'
            f" ({esc(duration(sum(v for p, v in parts if p in HOST_PARTS)))} a step), shared in proportion to"
            f" their measured lengths, so they read {percent(scale)} of those: {esc(duration(summary.dataloader_time))}"
            " in the DataLoader (data loading) and"
            f" {esc(duration(summary.framework_time))} outside torch operators (other) in the table beside.</p>"
        )
    if with_chart:
        figure = breakdown_figure([("step", parts)], title=title)
        html += chart(figure, height=figure["layout"]["height"])
    return html


def _present(operators: Sequence[OperatorStat], attr: str) -> bool:
    return any(getattr(op, attr) is not None for op in operators)


def operator_table(operators: Sequence[OperatorStat], *, device: str, limit: int = OPERATOR_ROWS) -> str:
    """The window's top ``limit`` operators (by self device time on a device run, else self CPU time), sortable
    by any column; columns with no value in the window (device times of a CPU run, memory when it was not
    profiled, shapes when they were not recorded, FLOPs) are left out."""
    if not operators:
        return '<p class="note">No operator table (the report holds none for this window).</p>'
    rows_of = top_operators(operators, sort_by=default_sort_key(device), row_limit=limit)
    columns = [c for c in COLUMNS if _present(rows_of, c[1])]
    shapes = _present(rows_of, "input_shapes")
    headers = ["Operator", *(c[0] for c in columns), *(["Input shapes"] if shapes else [])]
    rows: list[list[Cell | str]] = []
    for op in rows_of:
        cells: list[Cell | str] = [Cell(op.name), *value_cells(op, columns)]
        if shapes:
            cells.append(Cell(op.input_shapes or ""))
        rows.append(cells)
    numeric = [False, *(True for _ in columns), *([False] if shapes else [])]
    of = f" of {count(len(operators))}" if len(operators) > len(rows_of) else ""
    note = (
        f'<p class="note">The top {count(len(rows_of))}{of} operators by'
        f" {'self device' if default_sort_key(device) == 'self_device_time' else 'self CPU'} time"
        " (click a column's header to sort by it). Self: the operator's own time, without the operators it"
        " called; total: with them.</p>"
    )
    # A box of about 16 rows that scrolls: fifty rows a window would make every window a page long.
    box = '<div style="max-height: 480px; overflow-y: auto; display: inline-block">'
    return note + box + table(headers, rows, sortable=True, numeric=numeric) + "</div>"


def open_instructions(trace_path: str, *, logdir: str | None = None, run: str | None = None) -> str:
    """The trace's path and how to open it: Perfetto, Holistic Trace Analysis (its directory) and TensorBoard's
    PyTorch Profiler tab (``logdir``, ``run``: where TensorBoard finds it; by default the directory above the
    trace's, and the trace's directory's name). The commands name absolute paths: a relative one (``analyze
    runs/x``) would break in a shell opened elsewhere."""
    directory = os.path.abspath(os.path.dirname(trace_path) or ".")  # the commands work from any directory
    logdir = os.path.abspath(logdir if logdir is not None else os.path.dirname(directory))
    run = run if run is not None else os.path.basename(directory)
    hta = f"from hta.trace_analysis import TraceAnalysis; analysis = TraceAnalysis(trace_dir={directory!r})"
    return (
        f"<p>Trace: <code>{esc(trace_path)}</code></p><ul>"
        '<li><b>Perfetto</b>: open <a href="https://ui.perfetto.dev">ui.perfetto.dev</a> and drop the trace file'
        " on it (or <i>Open trace file</i>): it reads the <code>.json.gz</code> as it is, in the browser;"
        " the trace is not uploaded, but the page itself loads from the internet.</li>"
        f"<li><b>Holistic Trace Analysis</b> (every rank's trace in the directory): <code>{esc(hta)}</code></li>"
        f"<li><b>TensorBoard</b>: <code>tensorboard --logdir {esc(shlex.quote(logdir))}</code>, tab <i>PyTorch"
        f" Profiler</i>, run <code>{esc(run)}</code>. The tab loads Google Charts from the internet: without"
        " it, it shows a spinner and no chart.</li></ul>"
    )


def communication_html(summary: TraceSummary, *, with_chart: bool = True) -> str:
    """One step's time by communication: exposed (no compute overlapping it), overlapped with compute, and
    without any; a sentence and, ``with_chart``, a stacked bar. Empty where the trace shows no communication."""
    total, exposed = summary.communication_time, summary.communication_exposed_time
    if total is None or exposed is None or summary.step_time <= 0:
        return ""
    overlapped = max(total - exposed, 0.0)
    rest = max(summary.step_time - exposed - overlapped, 0.0)
    html = (
        f"<p>Per step: communication {esc(duration(total))}, of it {esc(duration(overlapped))} overlapped with compute"
        f" and <b>{esc(duration(exposed))} exposed</b> ({esc(percent(exposed / summary.step_time))} of the"
        f" {esc(duration(summary.step_time))} step, which waits for it).</p>"
    )
    if with_chart:
        parts = [(EXPOSED_COMMUNICATION, exposed), (OVERLAPPED_COMMUNICATION, overlapped), (NO_COMMUNICATION, rest)]
        figure = breakdown_figure([("step", parts)], title="One step's communication")
        html += chart(figure, height=figure["layout"]["height"])
    return html


def window_body(
    *,
    summary: TraceSummary | None,
    operators: Sequence[OperatorStat],
    device: str,
    trace_path: str,
    chart_title: str,
    collectives: Sequence[CollectiveStats] = (),
    facts: Sequence[tuple[str, str]] = (),
    findings: str = "",
    with_chart: bool = True,
    operator_limit: int = OPERATOR_ROWS,
    logdir: str | None = None,
    run: str | None = None,
) -> str:
    """A window's or a trace's section body: ``facts`` (the window's own: batches, peaks) and the trace's
    numbers, ``findings`` (HTML built by the caller), the step breakdown, the collectives, the operator table
    and how to open the trace."""
    rows = [*facts, *(summary_facts(summary) if summary is not None else ())]
    numbers = table(["what", "value"], [[name, value] for name, value in rows]) if rows else ""
    breakdown = "<h4>Step breakdown</h4>"
    if summary is None or summary.steps <= 0:
        breakdown += '<p class="note">No trace summary for this window (the report holds none).</p>'
    else:
        breakdown += breakdown_html(summary, title=chart_title, with_chart=with_chart)
    html = findings + f'<div class="grid"><div><h4>Per step</h4>{numbers}</div><div>{breakdown}</div></div>'
    if rows := collective_rows(collectives):
        header, *cells = rows
        html += "<h4>Collectives</h4>" + table(header, cells, numeric=[i >= 2 for i in range(len(header))])
        html += communication_html(summary, with_chart=with_chart) if summary is not None else ""
    html += "<h4>Operators</h4>" + operator_table(operators, device=device, limit=operator_limit)
    html += "<h4>Open the trace</h4>" + open_instructions(trace_path, logdir=logdir, run=run)
    return html
