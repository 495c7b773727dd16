"""What the benchmarks share about the machine they run on, and how they take turns on it (imported as
``machine``: run them as scripts)."""

from __future__ import annotations

import os


def cpu_busy_seconds() -> float | None:
    """CPU seconds the whole machine has been busy since boot (Linux ``/proc/stat``), ``None`` elsewhere."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    except (OSError, ValueError):
        return None
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def abba(round_: int) -> tuple[bool, bool]:
    """Whether round ``round_``'s two fits run with the callback, in ABBA order: bare then profiled, then profiled
    then bare, so that a steady drift of the machine's speed cancels over even rounds."""
    return (False, True) if round_ % 2 == 0 else (True, False)
