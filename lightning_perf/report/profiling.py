"""
Profiling cost, formatted
=========================

The run's profiling cost (:class:`~lightning_perf.budget.ProfilingCost`) on one line: the last line of each
Trainer call's console output, and a line of ``lightning-perf report``. Formatting only: what it cost, the
budget measures.
"""

from __future__ import annotations

from lightning_perf.budget import ProfilingCost
from lightning_perf.units import limit, percent, plural, seconds_or_ms


def profiling_line(cost: ProfilingCost) -> str | None:
    """The run's profiling cost on one line (a Trainer call's last, and ``lightning-perf report``'s):
    ``"lightning-perf: profiling cost 2.8% of this run (0.41 s of 14.6 s), 3 windows; 2 skipped for the budget
    (2%)"``; ``None`` before the run has wall time."""
    if cost.share is None:
        return None
    line = (
        f"lightning-perf: profiling cost {percent(cost.share, 1)} of this run ({seconds_or_ms(cost.seconds)} of"
        f" {seconds_or_ms(cost.run_seconds)}), {plural(cost.windows, 'window')}"
    )
    held = [f"{cost.skipped} skipped"] if cost.skipped else []
    if cost.flops_held:
        held.append("the FLOP count held back")
    if held:
        line += f"; {' and '.join(held)} for the budget ({limit(cost.budget or 0.0)})"
    return line
