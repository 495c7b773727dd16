"""
Findings, formatted
===================

An epoch's findings as a compact console table and as a markdown block for TensorBoard. Formatting only:
what is a finding, and how bad, the rules decide.
"""

from __future__ import annotations

from collections.abc import Sequence

from lightning_perf.diagnose.model import Finding
from lightning_perf.records import EpochSummary

CLEAN = "no bottleneck found"
_SHOWN = {0: (), 1: ("warning", "critical"), 2: ("info", "warning", "critical")}


def headline(summary: EpochSummary) -> str:
    """An epoch's headline numbers on one line."""
    parts = [
        f"{summary.batches} batches",
        f"step p50 {summary.step_time_p50 * 1e3:.2f} ms, p90 {summary.step_time_p90 * 1e3:.2f} ms",
        f"data wait {summary.data_wait_fraction:.0%}",
    ]
    if summary.throughput is not None:
        parts.append(f"{summary.throughput:,.0f} samples/s")
    if summary.loss is not None:
        parts.append(f"loss {summary.loss:.4g}")
    return ", ".join(parts)


def console_report(summary: EpochSummary, findings: Sequence[Finding], *, verbose: int) -> str | None:
    """What the console shows at an epoch's end: ``None`` at ``verbose=0``.

    ``verbose=1``: the headline and, per warning or critical finding, its title, window and advice; a clean
    epoch is one line. ``verbose=2``: info findings too, and each finding's evidence.
    """
    if verbose <= 0:
        return None
    shown = [f for f in findings if f.severity in _SHOWN[min(verbose, 2)]]
    head = f"lightning-perf | {summary.stage} epoch {summary.epoch} | {headline(summary)}"
    if not shown:
        return f"{head} | {CLEAN}"
    lines = [head]
    width = max(len(f.id) for f in shown)
    for f in shown:
        where = f"  [{f.window}]" if f.window else ""
        lines.append(f"  {f.severity.upper():<8} {f.id:<{width}}  {f.title}{where}")
        if verbose >= 2:
            lines.append(f"  {'':<8} {'':<{width}}  evidence: {f.evidence}")
        lines.append(f"  {'':<8} {'':<{width}}  -> {f.advice}")
    return "\n".join(lines)


def findings_markdown(summary: EpochSummary, findings: Sequence[Finding]) -> str:
    """An epoch's findings as a markdown block for TensorBoard's text dashboard (all severities)."""
    lines = [f"**{summary.stage} epoch {summary.epoch}**: {headline(summary)}", ""]
    if not findings:
        lines.append("No bottleneck found.")
        return "\n".join(lines) + "\n"
    lines += ["| severity | finding | evidence | advice | trace window |", "|---|---|---|---|---|"]
    for f in findings:
        cells = [f.severity, f"**{f.title}** (`{f.id}`)", f.evidence, f.advice, f"`{f.window}`" if f.window else ""]
        lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    return "\n".join(lines) + "\n"
