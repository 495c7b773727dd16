"""
The compare page
================

``lightning-perf compare BEFORE AFTER --html OUT``: two runs (or two traces) side by side, in the order a
person reads a comparison:

1. the two sides: what each ran on (device, precision, strategy, versions, DataLoader settings);
2. the headline metrics before and after, with their changes coloured by which way is better (a lower step
   time is, a lower throughput is not), grey where within run-to-run noise; a share's change (data wait, MFU)
   in percentage points;
3. the findings fixed, new and kept, with their severities, evidence and advice;
4. the operators whose self time changed most: a chart of the largest changes and a sortable table;
5. for two runs, their training epochs overlaid: step time p50 and throughput per epoch.

What is compared and how is :mod:`lightning_perf.report.comparison` (the same numbers ``compare`` prints);
this module only lays them out. Bounded: at most :data:`OPERATOR_ROWS` operators in the table,
:data:`CHART_OPERATORS` in the chart, and :data:`~lightning_perf.report.html.figures.MAX_EPOCH_POINTS` epochs a
side per chart, so the page is Plotly's JavaScript (about 4.6 MiB) plus tens of KiB, however long the runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from lightning_perf.diagnose.model import Finding
from lightning_perf.records import EpochSummary
from lightning_perf.report.comparison import (
    NOISE_POINTS,
    NOISE_RATIO,
    NOISE_US,
    ComparedSide,
    Metric,
    OperatorChange,
    advice_state,
    finding_changes,
    headline_metrics,
    operator_changes,
    operator_clock,
    relative_change,
)
from lightning_perf.report.html.document import Cell, Page, Section, chart, esc, number_cell, page, table
from lightning_perf.report.html.figures import thinned
from lightning_perf.report.html.findings_html import about_findings, finding_html
from lightning_perf.units import change, count, duration_us, plural

OPERATOR_ROWS = 100
"""Operators in the table, the largest changes first: a window's table has a few hundred operators, and past
the first hundred changes are a few µs each."""
CHART_OPERATORS = 15
"""Operators in the bar chart of the largest changes: as many as stay legible as bars on one chart."""
BAR_PIXELS, FRAME_PIXELS = 26, 120
"""The bar chart's height: per bar (a line of 12 px tick text and its gap), plus its title and axis."""
NAME_CHARS = 60
"""An operator's name on the chart's axis is cut to this many characters (the table shows it whole)."""
TITLE_LEFT = {"x": 0.01, "xanchor": "left"}  # clear of Plotly's buttons, top right
EPOCH_TICKS = 10  # ticks on a per-epoch chart's axis, at most (Plotly's default for a chart's width)
SIDE_COLOURS = {"before": "#9aa3b2", "after": "#286ec8"}
FASTER, SLOWER = "#1e7d32", "#b3261e"  # the page's .good and .bad colours (document.STYLE)
SAME = "#9aa3b2"  # a change within the noise: the neutral grey of the "before" series
BAR_COLOURS = {"better": FASTER, "worse": SLOWER, "same": SAME}
_NOISE = (
    f"the same, within run-to-run noise (a change under {NOISE_RATIO:.0%}; a share's, in percentage points (pp),"
    f" under {NOISE_POINTS * 100:g} pp)"
)


def compare_page(before: ComparedSide, after: ComparedSide) -> Page:
    """The page of ``compare --html``: ``before`` and ``after`` side by side (see the module docstring)."""
    sections = [
        Section("sides", "The two sides", _sides(before, after)),
        Section("headline", "Headline", _headline(before, after)),
        Section("findings", "Findings", _findings(before, after)),
        Section("operators", "Operators", _operators(before, after)),
    ]
    if before.epochs and after.epochs:
        sections.append(Section("epochs", "Per epoch", _epochs(before, after)))
    changes = finding_changes(before, after)
    if (about := about_findings([*changes.new, *(a for _, a in changes.kept), *changes.fixed])) is not None:
        sections.append(about)
    kind = "runs" if before.kind == after.kind == "run" else "traces" if before.kind == after.kind else "sides"
    return page(f"lightning-perf compare: two {kind}", f"before: {before.label} · after: {after.label}", sections)


def _sides(before: ComparedSide, after: ComparedSide) -> str:
    names = list(dict.fromkeys(name for name, _ in (*before.facts, *after.facts)))
    facts_before, facts_after = dict(before.facts), dict(after.facts)
    rows: list[Sequence[Cell | str]] = [
        ("path", before.label, after.label),
        ("kind", before.kind, after.kind),
        *((name, facts_before.get(name, "-"), facts_after.get(name, "-")) for name in names),
    ]
    return table(["", "before", "after"], rows, id="sides-table")


def _change_cell(sort: float | None, verdict: str | None, text: str) -> Cell:
    """A change shown as ``text``, coloured where one way is better (grey where within the noise), sorted by
    ``sort`` (a dash where ``None``)."""
    if sort is None:
        return number_cell(None)
    css = {"better": "good", "worse": "bad", "same": "muted"}.get(verdict or "")
    shown = f'<span class="{css}">{esc(text)}</span>' if css else esc(text)
    return Cell(shown, sort=sort, num=True, html=True)


def _headline(before: ComparedSide, after: ComparedSide) -> str:
    metrics = headline_metrics(before, after)
    known = [m for m in metrics if m.before is not None or m.after is not None]
    unknown = [m.name for m in metrics if m not in known]
    rows = [
        (m.name, _value_cell(m, m.before), _value_cell(m, m.after), _change_cell(m.delta, m.verdict, m.change))
        for m in known
    ]
    what = {
        "run": "a run: its last measured training epoch",
        "trace": "a trace: the mean of its steps (no percentiles, throughput or memory)",
    }
    notes = [what[k] for k in dict.fromkeys((before.kind, after.kind))]
    text = f'<p class="note">Per side, {esc("; ".join(notes))}. Green: better, red: worse, grey: {esc(_NOISE)}.'
    if unknown:
        text += f" Not known on either side: {esc(', '.join(unknown))}."
    return (
        text
        + "</p>"
        + table(["metric", "before", "after", "change"], rows, numeric=[False, True, True, True], id="headline-table")
    )


def _value_cell(metric: Metric, value: float | None) -> Cell:
    return number_cell(value, None if value is None else metric.format(value))


def _findings(before: ComparedSide, after: ComparedSide) -> str:
    changes = finding_changes(before, after)
    rows: list[Sequence[Cell | str]] = []
    for f in changes.fixed:
        rows.append(("fixed", f.id, f.severity, "-", advice_state(before, f.id), f.title))
    for f in changes.new:
        rows.append(("new", f.id, "-", f.severity, advice_state(after, f.id), f.title))
    for b, a in changes.kept:
        rows.append(("kept", a.id, b.severity, a.severity, advice_state(after, a.id), a.title))
    counts = (
        f"{count(len(changes.fixed))} fixed, {count(len(changes.new))} new, {count(len(changes.kept))} kept"
        " (warnings and critical findings; info ones are left out)"
    )
    if not rows:
        return f'<p class="note">No warning or critical finding on either side: {esc(counts)}.</p>'
    headers = ["change", "rule", "severity before", "severity after", "advice tried (on its side)", "title"]
    parts = [f'<p class="note">{esc(counts)}.</p>', table(headers, rows, sortable=True, id="findings-table")]
    groups: list[tuple[str, list[tuple[Finding, str]]]] = [
        ("New (after)", [(f, "new") for f in changes.new]),
        ("Kept (as after shows them)", [(a, f"kept, before: {b.severity}") for b, a in changes.kept]),
        ("Fixed (as before showed them)", [(f, "fixed") for f in changes.fixed]),
    ]
    for title, findings in groups:
        if findings:
            parts.append(f"<h3>{esc(title)}</h3>" + "".join(finding_html(f, where=where) for f, where in findings))
    return "".join(parts)


def _operators(before: ComparedSide, after: ComparedSide) -> str:
    changes = [c for c in operator_changes(before, after) if c.delta]
    if not changes:
        return '<p class="note">No operator table on either side, or no operator whose self time changed.</p>'
    clock = operator_clock(before, after)
    sources = f"before: {before.operators_from or '-'}; after: {after.operators_from or '-'}"
    verdicts = [c.verdict for c in changes]
    note = (
        f"Self {clock} time per profiler window, summed over the window's steps ({sources}). Faster: green,"
        f" slower: red, grey: the same, within run-to-run noise (a change under {NOISE_RATIO:.0%} or under"
        f" {NOISE_US:g} µs). {count(verdicts.count('better'))} faster, {count(verdicts.count('worse'))} slower,"
        f" {count(verdicts.count('same'))} the same; the {plural(min(len(changes), OPERATOR_ROWS), 'operator')}"
        f" that changed most of {count(len(changes))}; click a header to sort."
    )
    shown = changes[:OPERATOR_ROWS]
    rows = [_operator_row(c, before, after) for c in shown]
    headers = ["operator", "before", "after", "change", "change %", "calls before", "calls after"]
    return (
        f'<p class="note">{esc(note)}</p>'
        + chart(
            operators_figure(changes[:CHART_OPERATORS], clock),
            id="operators-chart",
            height=FRAME_PIXELS + BAR_PIXELS * min(len(changes), CHART_OPERATORS),
        )
        + table(headers, rows, sortable=True, numeric=[False, *[True] * 6], id="operators-table")
    )


def _operator_row(c: OperatorChange, before: ComparedSide, after: ComparedSide) -> list[Cell | str]:
    ratio = relative_change(c.before, c.after) if c.in_before and c.in_after else None
    delta = _delta_text(c)

    def calls(side: ComparedSide) -> Cell:
        op = side.operators.get(c.name)
        return number_cell(None if op is None else op.calls, None if op is None else count(op.calls))

    return [
        c.name,
        number_cell(c.before if c.in_before else None, duration_us(c.before)),
        number_cell(c.after if c.in_after else None, duration_us(c.after)),
        _change_cell(c.delta, c.verdict, delta),
        _change_cell(ratio, c.verdict, change(ratio)) if ratio is not None else number_cell(None),
        calls(before),
        calls(after),
    ]


def _delta_text(c: OperatorChange) -> str:
    """An operator's change of self time, signed, and how it reads: ``"-1.20 ms (faster)"``."""
    return f"{'-' if c.delta < 0 else '+'}{duration_us(abs(c.delta))} ({c.word})"


def operators_figure(changes: Sequence[OperatorChange], clock: str) -> dict[str, Any]:
    """A horizontal bar per operator: its change of self time in ms (negative: faster), the largest on top;
    green where faster, red where slower, grey where within the noise."""
    ordered = list(reversed(changes))  # Plotly draws a horizontal bar chart's first category at the bottom
    names = [esc(_short(c.name)) for c in ordered]
    hover = [
        f"{esc(c.name)}<br>before {duration_us(c.before)} → after {duration_us(c.after)}<br>change {_delta_text(c)}"
        for c in ordered
    ]
    return {
        "data": [
            {
                "type": "bar",
                "orientation": "h",
                "x": [c.delta / 1e3 for c in ordered],
                "y": names,
                "marker": {"color": [BAR_COLOURS[c.verdict] for c in ordered]},
                "hovertext": hover,
                "hoverinfo": "text",
                "name": "change of self time",
            }
        ],
        "layout": {
            "title": {"text": f"Largest changes of self {clock} time per window (after - before)", **TITLE_LEFT},
            "xaxis": {"title": {"text": f"change of self {clock} time (ms; negative: faster)"}, "zeroline": True},
            "yaxis": {"title": {"text": "operator", "standoff": 12}, "automargin": True, "type": "category"},
            "showlegend": False,
            "margin": {"l": 20, "r": 20, "t": 40, "b": 50},
        },
    }


def _short(name: str) -> str:
    return name if len(name) <= NAME_CHARS else name[: NAME_CHARS - 1] + "…"


def _epochs(before: ComparedSide, after: ComparedSide) -> str:
    note = (
        "Each run's measured training epochs (batches inside profiler windows left out, as in the headline);"
        " the headline compares the last."
    )
    figures = [
        epoch_figure(before, after, "Step time p50 per epoch", "step time p50 (ms)", lambda e: e.step_time_p50 * 1e3),
        epoch_figure(before, after, "Throughput per epoch", "throughput (samples/s)", lambda e: e.throughput),
    ]
    charts = "".join(chart(f, id=f"epochs-chart-{i}") for i, f in enumerate(figures))
    return f'<p class="note">{esc(note)}</p><div class="grid">{charts}</div>'


def epoch_figure(
    before: ComparedSide,
    after: ComparedSide,
    title: str,
    axis: str,
    value: Callable[[EpochSummary], float | None],
) -> dict[str, Any]:
    """One metric per training epoch, a line per run (at most ``MAX_EPOCH_POINTS`` epochs each)."""
    data = []
    points = max(len(before.epochs), len(after.epochs))
    for name, side in (("before", before), ("after", after)):
        epochs = [side.epochs[i] for i in thinned(len(side.epochs))]
        data.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": name,
                "x": [e.epoch for e in epochs],
                "y": [value(e) for e in epochs],
                "line": {"color": SIDE_COLOURS[name]},
                "hovertemplate": f"{name}, epoch %{{x}}: %{{y:.4g}}<extra></extra>",
            }
        )
    return {
        "data": data,
        "layout": {
            "title": {"text": title, **TITLE_LEFT},
            # Ticks on whole epochs: at most one per epoch (Plotly would tick 0.5 between two epochs).
            "xaxis": {"title": {"text": "training epoch"}, "nticks": min(EPOCH_TICKS, max(points, 2))},
            "yaxis": {"title": {"text": axis}, "rangemode": "tozero"},
            "showlegend": True,
        },
    }
