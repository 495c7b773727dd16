"""
The traces page
===============

``lightning-perf analyze PATH... --html OUT``: any Kineto traces, grouped by directory as ``analyze`` groups
them (:func:`traces_page`). Per directory of distinct ranks: their per-rank table, the cross-rank findings and
one chart of every rank's step breakdown. Per trace: its numbers per step, its findings, its step breakdown,
its operator table and how to open it (:func:`~lightning_perf.report.html.windows.window_body`, as the run
page shows a window).

Bounded: the operator tables hold :data:`PAGE_OPERATORS` rows in all (at most 50 a trace, at least 10), and a
directory's breakdown chart at most :data:`CHART_TRACES` traces.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from lightning_perf.records import TraceSummary
from lightning_perf.report.analyzed import AnalyzedDirectory, AnalyzedTrace
from lightning_perf.report.html.breakdown import step_breakdown
from lightning_perf.report.html.document import Page, Section, chart, esc, page
from lightning_perf.report.html.figures import breakdown_figure
from lightning_perf.report.html.findings_html import about_findings, finding_html
from lightning_perf.report.html.run_charts import rank_table
from lightning_perf.report.html.windows import window_body
from lightning_perf.report.json_report import OPERATOR_ROWS
from lightning_perf.units import count, duration, plural

TITLE = "lightning-perf traces"
PAGE_OPERATORS = 2_000
"""Operator rows on the page, all traces together: 50 a trace up to 40 traces, fewer each beyond (a 128-rank
directory: 15 a rank), never under :data:`MIN_TRACE_OPERATORS`. About 0.5 KB a row."""
MIN_TRACE_OPERATORS = 10
CHART_TRACES = 64
"""Traces in a directory's breakdown chart (bars of 28 px: a 64-rank chart is about 1,900 px tall); the rest
have their breakdown as a table in their own section."""


def _anchor(directory: int, trace: int) -> str:
    return f"trace-{directory}-{trace}"


def _device(summary: TraceSummary) -> str:
    return "cpu" if summary.device_busy is None else "cuda"


def _trace_section(
    d: int, t: int, trace: AnalyzedTrace, anchors: dict[str, str], *, with_chart: bool, operators: int
) -> str:
    name = os.path.basename(trace.path)
    s = trace.summary
    own = [dataclasses.replace(f, window=None) if f.window == name else f for f in trace.findings]  # it is here
    findings = "".join(finding_html(f, anchors=anchors) for f in own)
    findings = findings or '<p class="note">No bottleneck found in this trace.</p>'
    body = window_body(
        summary=s,
        operators=trace.operators,
        device=_device(s),
        trace_path=trace.path,
        chart_title=f"rank {trace.rank}: step breakdown",
        findings=f"<h4>Findings</h4>{findings}",
        with_chart=with_chart,
        operator_limit=operators,
        collectives=trace.collectives,
    )
    head = (
        f"rank {trace.rank}: <code>{esc(name)}</code> · {esc(plural(s.steps, 'step'))} of {esc(duration(s.step_time))}"
    )
    return f'<section id="{esc(_anchor(d, t))}"><h3>{head}</h3>{body}</section>'


def _directory(d: int, directory: AnalyzedDirectory, operators: int) -> Section:
    traces = directory.traces
    anchors = {os.path.basename(t.path): _anchor(d, i) for i, t in enumerate(traces)}
    html = ""
    if len(traces) > 1:
        links = ", ".join(
            f'<a href="#{esc(_anchor(d, i))}">rank {t.rank}</a>' for i, t in enumerate(traces[:CHART_TRACES])
        )
        html += f"<p>{esc(plural(len(traces), 'trace'))}: {links}{' ...' if len(traces) > CHART_TRACES else ''}</p>"
    if directory.ranks:
        html += "<h3>Across ranks</h3>" + rank_table(directory.ranks)
        cross = "".join(finding_html(f, anchors=anchors) for f in directory.findings)
        html += cross or '<p class="note">No cross-rank finding.</p>'
    elif len(traces) > 1:
        html += '<p class="note">No cross-rank comparison: these traces do not hold distinct ranks of one run.</p>'
    if len(traces) > 1:
        rows = [(f"rank {t.rank}", step_breakdown(t.summary)) for t in traces[:CHART_TRACES] if t.summary.steps > 0]
        if rows:
            figure = breakdown_figure(rows, title="Step breakdown per trace")
            html += chart(figure, height=figure["layout"]["height"])
    for i, trace in enumerate(traces):
        html += _trace_section(d, i, trace, anchors, with_chart=len(traces) == 1, operators=operators)
    return Section(f"directory-{d}", directory.path, html)


def traces_page(directories: Sequence[AnalyzedDirectory]) -> Page:
    """The page of ``analyze --html``: a section per directory (see the module's docstring)."""
    traces = sum(len(d.traces) for d in directories)
    operators = max(MIN_TRACE_OPERATORS, min(OPERATOR_ROWS, PAGE_OPERATORS // max(traces, 1)))
    sections = [_directory(i, d, operators) for i, d in enumerate(directories)]
    if not sections:
        sections = [Section("traces", "Traces", '<p class="note">No trace was analyzed.</p>')]
    findings = [f for d in directories for f in (*d.findings, *(f for t in d.traces for f in t.findings))]
    if (about := about_findings(findings)) is not None:
        sections.append(about)
    where = "1 directory" if len(directories) == 1 else f"{count(len(directories))} directories"
    subtitle = f"{plural(traces, 'trace')} in {where}"
    return page(TITLE, subtitle, sections)
