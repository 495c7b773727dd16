"""
Memory on the run page
======================

What fills memory (``run.memory``, :func:`lightning_perf.summarize.memory.memory_report`): one stacked bar of
the parts, the device's free memory last where it is known, and a table of the same bytes with the optimizer
state by entry; first, where the run died of an out-of-memory error, its diagnosis (``run.out_of_memory``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning_perf.diagnose.out_of_memory import ACTIVATIONS_UNMEASURED, memory_parts
from lightning_perf.report.html.document import Cell, chart, esc, number_cell, table
from lightning_perf.summarize.memory import checked_memory
from lightning_perf.units import MIB, percent, signed_size

# One colour per part, in the order they stack; free memory is drawn pale.
MEMORY_COLOURS = {
    "parameters": "#1f77b4",
    "gradients": "#ff7f0e",
    "optimizer state": "#2ca02c",
    "master copies": "#9467bd",
    "activations and temporaries": "#d62728",
    "activations saved for the backward": "#d62728",
    "allocator overhead": "#8c564b",
    "outside the allocator": "#7f7f7f",
    "free": "#e5e5e5",
}


def memory_figure(parts: list[tuple[str, int]]) -> dict[str, Any]:
    """One horizontal bar stacking the parts (MiB)."""
    total = sum(value for _, value in parts) or 1
    data = [
        {
            "type": "bar",
            "orientation": "h",
            "name": name,
            "y": ["memory"],
            "x": [round(value / MIB, 3)],
            "marker": {"color": MEMORY_COLOURS.get(name, "#888888")},
            "hovertemplate": f"{esc(name)}: {esc(signed_size(value))} ({percent(value / total, 1)})<extra></extra>",
        }
        for name, value in parts
    ]
    layout = {
        "title": {"text": "What fills memory"},
        "barmode": "stack",
        "xaxis": {"title": {"text": "MiB"}},
        "yaxis": {"visible": False},
    }
    return {"data": data, "layout": layout}


def memory_html(run: Mapping[str, Any], *, charts: bool = True) -> str | None:
    """The run page's memory section; ``None`` where the report has no ``run.memory``."""
    memory = checked_memory(run.get("memory"))
    if memory is None:
        return None
    parts = memory_parts(dict(memory))
    total = sum(value for _, value in parts)
    rows: list[list[Cell | str]] = [
        [Cell(name), number_cell(value, signed_size(value)), number_cell(value, percent(value / total, 1))]
        for name, value in parts
    ]
    entries = memory["optimizer_state"].get("by_entry") or {}
    state = ", ".join(f"{esc(str(k))} {esc(signed_size(v))}" for k, v in entries.items())
    optimizers = ", ".join(esc(str(name)) for name in memory["optimizers"]) or "no optimizer"
    note = (
        f'<p class="note">Counted at the end of training epoch {esc(str(memory.get("epoch")))}, on'
        f" {esc(str(memory.get('device')))}; optimizer state of {optimizers}{': ' + state if state else ''}."
        f"{_activations_note(memory)}</p>"
    )
    bar = chart(memory_figure(parts), height=220) if charts and parts else ""
    return _out_of_memory(run) + bar + table(["part", "bytes", "share"], rows, numeric=[False, True, True]) + note


def _activations_note(memory: Mapping[str, Any]) -> str:
    """What the section's activations are, where they were measured, or where they would be."""
    window = memory.get("activations_window")
    if memory.get("activations") is not None:
        if not window:
            return ""  # CUDA's, from the allocator's peaks: the table says so
        return (
            f" Activations and temporaries: the most a step's forward allocated in window {esc(str(window))}"
            " (the profiler's memory events)."
        )
    unmeasured = esc(ACTIVATIONS_UNMEASURED)
    if memory.get("activations_saved") is not None:
        return f" Activations: what one training batch saved for the backward (its temporaries: {unmeasured})."
    return f" {unmeasured[0].upper()}{unmeasured[1:]}."


def _out_of_memory(run: Mapping[str, Any]) -> str:
    """The run's out-of-memory diagnosis (``run.out_of_memory.finding``), where it died of one."""
    failure = run.get("out_of_memory")
    if not isinstance(failure, Mapping) or not isinstance(found := failure.get("finding"), Mapping):
        return ""
    sites = failure.get("largest_allocations") or []
    rows: list[list[Cell | str]] = [
        [Cell(str(site)), number_cell(nbytes, signed_size(int(nbytes)))]
        for site, nbytes in sites
        if isinstance(nbytes, (int, float))
    ]
    snapshot = failure.get("snapshot")
    return (
        f'<p class="banner">{esc(str(found.get("title", "")))}: {esc(str(found.get("evidence", "")))}</p>'
        f"<p>{esc(str(found.get('advice', '')))}</p>"
        + (table(["largest live allocations, by call site", "bytes"], rows, numeric=[False, True]) if rows else "")
        + (
            f'<p class="note">The allocator\'s snapshot: <code>{esc(str(snapshot))}</code> (open it at'
            " pytorch.org/memory_viz).</p>"
            if snapshot
            else ""
        )
    )
