"""lightning-perf: PyTorch Lightning callbacks that tell you why training is slow and what to change.

The callback and the records are imported on first use, so that the offline command line
(``lightning-perf``, ``python -m lightning_perf``) starts without importing torch or Lightning.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0.dev0"

_EXPORTS = {
    "PerfCallback": "lightning_perf.callback",
    "Schedule": "lightning_perf.config",
    "EpochSummary": "lightning_perf.records",
    "OperatorStat": "lightning_perf.records",
    "WindowRecord": "lightning_perf.records",
    "peak_flops": "lightning_perf.peak_table",
}

__all__ = [*sorted(_EXPORTS), "__version__"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'lightning_perf' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
