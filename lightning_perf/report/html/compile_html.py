"""
torch.compile on the run page
=============================

What ``torch.compile`` did in the run, from the epochs' ``compile``
(:class:`~lightning_perf.records.CompileStats`): per epoch in which something compiled, its graphs, graph
breaks, recompiles and seconds (at most :data:`MAX_COMPILE_EPOCHS` epochs, the newest); over the run, the graph
breaks by reason and place and the recompiles by function and failed guard (at most :data:`MAX_SITES` each,
the most frequent).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from lightning_perf.report.findings import compile_line, epoch_label
from lightning_perf.report.html.document import Cell, esc, number_cell, table
from lightning_perf.report.json_report import ReportEpoch
from lightning_perf.units import count, duration

MAX_COMPILE_EPOCHS = 50
"""Epochs listed: a compiled run compiles in its first epochs; one that recompiles every epoch is listed by its
newest (and says so in its findings)."""
MAX_SITES = 20
"""Graph-break sites and recompile guards listed, the most frequent first."""


def _epochs_table(compiled: Sequence[ReportEpoch]) -> str:
    rows: list[list[Cell | str]] = []
    for e in compiled[-MAX_COMPILE_EPOCHS:]:
        stats = e.compile
        assert stats is not None
        rows.append(
            [
                e.summary.stage,
                number_cell(e.summary.epoch),
                number_cell(stats.graphs, count(stats.graphs)),
                number_cell(stats.breaks, count(stats.breaks)),
                number_cell(stats.recompiles, count(stats.recompiles)),
                number_cell(stats.seconds, duration(stats.seconds)),
                number_cell(stats.seconds_before, duration(stats.seconds_before)),
                "yes" + (f": {stats.limit_function}" if stats.limit_function else "") if stats.limit_reached else "",
                ", ".join(map(str, stats.steps[:10])) + (" ..." if len(stats.steps) > 10 else ""),
            ]
        )
    headers = ["stage", "epoch", "graphs", "graph breaks", "recompiles", "compiling", "of it before batch 0"]
    headers += ["recompile limit reached", "batches that compiled"]
    note = (
        f'<p class="note">The newest {MAX_COMPILE_EPOCHS} of {len(compiled)} epochs that compiled.</p>'
        if len(compiled) > MAX_COMPILE_EPOCHS
        else ""
    )
    numeric = [False, True, True, True, True, True, True, False, False]
    return note + table(headers, rows, sortable=True, numeric=numeric)


def _sites(compiled: Sequence[ReportEpoch]) -> str:
    breaks: Counter[tuple[str, str | None]] = Counter()
    guards: Counter[tuple[str | None, str | None]] = Counter()
    for e in compiled:
        assert e.compile is not None
        for b in e.compile.break_sites:
            breaks[(b.reason, b.location)] += b.count
        for r in e.compile.recompile_guards:
            guards[(r.function, r.guard)] += r.count
    html = ""
    if breaks:
        top = breaks.most_common(MAX_SITES)
        rows = [[Cell(reason), Cell(where or "unknown"), number_cell(n, count(n))] for (reason, where), n in top]
        html += "<h3>Graph breaks</h3>" + table(["reason", "where", "compiles that met it"], rows, sortable=True)
    if guards:
        top_guards = guards.most_common(MAX_SITES)
        rows = [[Cell(f or "unknown"), Cell(g or "unknown"), number_cell(n, count(n))] for (f, g), n in top_guards]
        html += "<h3>Recompiles</h3>" + table(["function", "failed guard", "recompiles"], rows, sortable=True)
    return html


def compile_html(stages: Mapping[str, Sequence[ReportEpoch]]) -> str | None:
    """The torch.compile section's body; ``None`` for a run in which nothing compiled."""
    compiled = [e for epochs in stages.values() for e in epochs if compile_line(e.compile) is not None]
    if not compiled:
        return None
    lines = "".join(
        f"<li>{esc(e.summary.stage)} {epoch_label(e.summary)}: {esc(compile_line(e.compile))}</li>"
        for e in compiled[:3]
    )
    return f"<ul>{lines}</ul>" + _epochs_table(compiled) + _sites(compiled)
