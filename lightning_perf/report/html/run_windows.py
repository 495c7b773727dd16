"""
The run's profiler windows
==========================

The run page's windows section: a table of the report's windows, then one section per window (id
``window-<name>``, the anchor its findings link to) with what :func:`~lightning_perf.report.html.windows.window_body`
shows. At most :data:`MAX_WINDOW_SECTIONS` windows get a section (the report holds at most ``max_windows`` per
stage, 5 by default); any more are rows of the table only.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence

from lightning_perf.diagnose.model import Finding
from lightning_perf.records import WindowRecord, share
from lightning_perf.report.html.document import Cell, esc, number_cell, table
from lightning_perf.report.html.windows import window_body
from lightning_perf.units import count, duration, mib, percent, seconds_or_ms

MAX_WINDOW_SECTIONS = 40
"""Windows with a section of their own (chart, operator table): those the findings name first, then the
newest. The default ``max_windows`` (5 per stage, 20 for four stages) stays under it."""


def anchor(name: str) -> str:
    """The id of a window's section."""
    return f"window-{name}"


def _title(w: WindowRecord) -> str:
    return f"{w.stage} epoch {w.epoch}, batches {w.first_batch}-{w.last_batch}"


def _facts(w: WindowRecord) -> list[tuple[str, str]]:
    rows = [("window", w.name), ("recorded", f"{_title(w)} ({count(w.num_batches)} batches)")]
    if w.shortened:
        rows.append(("shortened", "the epoch ended before the window recorded all its planned batches"))
    rows.append(("the loop paused at its close", seconds_or_ms(w.close_seconds)))
    if w.cost_seconds is not None:
        rows.append(("its cost to the run (close, slowed batches, processing)", seconds_or_ms(w.cost_seconds)))
    for value, name in ((w.cuda_max_allocated, "CUDA max allocated"), (w.cuda_max_reserved, "CUDA max reserved")):
        if value is not None:
            rows.append((name, mib(value)))
    return rows


def shown_windows(windows: Sequence[WindowRecord], findings: Sequence[Finding]) -> list[WindowRecord]:
    """The windows that get a section: all of them, or :data:`MAX_WINDOW_SECTIONS` (see there), in order."""
    named = {f.window for f in findings if f.window}
    if len(windows) <= MAX_WINDOW_SECTIONS:
        return list(windows)
    order = [w for w in windows if w.name in named] + list(reversed(windows))
    kept: dict[str, WindowRecord] = {}
    for w in order:
        if len(kept) == MAX_WINDOW_SECTIONS:
            break
        kept.setdefault(w.name, w)
    return [w for w in windows if w.name in kept]


def _overview(windows: Sequence[WindowRecord], shown: set[str]) -> str:
    rows: list[list[Cell | str]] = []
    for w in windows:
        s = w.summary
        link = f'<a href="#{esc(anchor(w.name))}"><code>{esc(w.name)}</code></a>' if w.name in shown else esc(w.name)
        busy = None if s is None else share(s.device_busy, s)
        exposed = None if s is None else share(s.communication_exposed_time, s)
        rows.append(
            [
                Cell(link, html=True),
                w.stage,
                number_cell(w.epoch),
                number_cell(None if s is None else s.step_time, None if s is None else duration(s.step_time)),
                number_cell(busy, None if busy is None else percent(busy)),
                number_cell(exposed, None if exposed is None else percent(exposed)),
                number_cell(None if s is None else s.ops_per_step, None if s is None else count(s.ops_per_step)),
            ]
        )
    headers = ["window", "stage", "epoch", "mean step", "device busy", "comm. exposed", "host ops per step"]
    return table(headers, rows, sortable=True, numeric=[False, False, True, True, True, True, True])


def _other_ranks(w: WindowRecord, world_size: int) -> str:
    directory = os.path.dirname(w.trace_path) or "."
    command = f"lightning-perf analyze {shlex.quote(os.path.abspath(directory))} --html ranks.html"
    return (
        f"<p class=\"note\">This window's numbers, breakdown and operators are rank 0's trace. The other"
        f" {world_size - 1} ranks' traces are in the same directory, <code>{esc(directory)}</code>, as"
        f" <code>rank1.pt.trace.json.gz</code> ... <code>rank{world_size - 1}.pt.trace.json.gz</code>;"
        f" <code>{esc(command)}</code>"
        " shows every rank, side by side.</p>"
    )


def windows_html(
    windows: Sequence[WindowRecord], findings: Sequence[Finding], *, world_size: int = 1, charts: bool = True
) -> str:
    """The windows section's body: their table, then a section per window :func:`shown_windows`, listing the
    titles of the ``findings`` that name it; in a distributed run (``world_size`` above 1), where the other
    ranks' traces are; ``charts=False``: no step breakdown chart (its table stays)."""
    if not windows:
        return (
            '<p class="note">No profiler window was recorded (<code>max_windows=0</code>, stages too short for'
            " the schedule, or none of the stages profiled): the charts above come from the always-on"
            " measurements.</p>"
        )
    shown = shown_windows(windows, findings)
    names = {w.name for w in shown}
    html = _overview(windows, names)
    if len(shown) < len(windows):
        html += f'<p class="note">{len(shown)} of {len(windows)} windows have a section below.</p>'
    for w in shown:
        named = {f.id: f for f in findings if f.window == w.name}
        listed = "".join(
            f'<li><span class="severity">{esc(f.severity)}</span>{esc(f.title)} (<code>{esc(f.id)}</code>)</li>'
            for f in named.values()
        )
        body = window_body(
            summary=w.summary,
            operators=w.operators,
            collectives=w.collectives,
            device=w.device,
            trace_path=w.trace_path,
            chart_title=f"{_title(w)}: step breakdown",
            with_chart=charts,
            facts=_facts(w),
            findings=(_other_ranks(w, world_size) if world_size > 1 else "")
            + (f'<p>Findings this window shows (<a href="#findings">above</a>):</p><ul>{listed}</ul>' * bool(listed)),
        )
        html += (
            f'<section id="{esc(anchor(w.name))}"><h3>{esc(_title(w))}: <code>{esc(w.name)}</code></h3>{body}</section>'
        )
    return html
