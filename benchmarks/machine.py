"""What the benchmarks share about the machine they run on (imported as ``machine``: run them as scripts)."""

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
