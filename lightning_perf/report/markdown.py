"""
Markdown
========

Tables as markdown, for TensorBoard's text dashboard (which renders GitHub-style tables) and for the
``*.operators.md`` file beside each trace.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from lightning_perf.records import OperatorStat, WindowRecord
from lightning_perf.units import count, duration_us, flops, signed_size

OperatorColumn = tuple[str, str, Callable[[Any], str]]
OPERATOR_COLUMNS: tuple[OperatorColumn, ...] = (
    ("Calls", "calls", count),
    ("Self CPU", "self_cpu_time", duration_us),
    ("CPU total", "cpu_time", duration_us),
    ("Self device", "self_device_time", duration_us),
    ("Device total", "device_time", duration_us),
    ("Self CPU mem", "self_cpu_memory", signed_size),
    ("Self device mem", "self_device_memory", signed_size),
    ("FLOPs", "flops", flops),
)
"""An operator table's number columns, here and in the HTML report: (header, :class:`OperatorStat` field,
formatter; times are in microseconds); a table shows a column only when some row has a value for it."""
_COLUMNS = (*OPERATOR_COLUMNS, ("Input shapes", "input_shapes", lambda s: f"`{s}`"))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def operator_table(window: WindowRecord, rows: Sequence[OperatorStat], *, sort_by: str) -> str:
    """A window's operator table as markdown, headed by the window it belongs to."""
    columns = [c for c in _COLUMNS if any(getattr(r, c[1]) is not None for r in rows)]
    header = ["Operator", *(name for name, _, _ in columns)]
    lines = [
        f"**{window.name}** ({window.stage}, epoch {window.epoch}, batches {window.first_batch}-"
        f"{window.last_batch}{', shortened' if window.shortened else ''}): top {len(rows)} operators by "
        f"`{sort_by}`. Trace: `{window.trace_path}`",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---"] + ["---:"] * len(columns)) + "|",
    ]
    for row in rows:
        cells = [f"`{_cell(row.name)}`"]
        for _, attr, fmt in columns:
            value = getattr(row, attr)
            cells.append("" if value is None else _cell(fmt(value)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
