"""
Memory tracking
===============

When the callback counts what the model holds (:func:`~lightning_perf.collect.model_memory.model_memory`): at
each training epoch's end, where the gradients and the optimizer state of the last step still exist (Lightning
zeroes the gradients at the start of the next step). It walks the parameters and the optimizer state once an
epoch, never per batch. The report's ``run.memory`` is the latest count; the console says it the first time and
whenever the model's part changes (a new optimizer, layers frozen or unfrozen).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from lightning_perf.collect.memory import device_use
from lightning_perf.collect.model_memory import model_memory
from lightning_perf.records import EpochSummary, ModelMemory
from lightning_perf.report.memory import memory_line
from lightning_perf.summarize.memory import memory_report


class MemoryTracking:
    """The model's memory, counted at each training epoch's end."""

    def __init__(self) -> None:
        self.last: ModelMemory | None = None

    def measure(self, trainer: pl.Trainer, summary: EpochSummary, run_info: dict[str, Any]) -> str | None:
        """Counts the model's memory after the training epoch ``summary``, puts it in ``run_info["memory"]``, and
        returns the console's line where it is new or changed (``None`` where it is as before)."""
        model = model_memory(trainer.lightning_module, trainer.optimizers)
        device = trainer.strategy.root_device
        use = device_use(device) if device.type == "cuda" else None
        run_info["memory"] = memory = memory_report(
            model,
            epoch=summary.epoch,
            peak_allocated=summary.cuda_max_allocated,
            peak_reserved=summary.cuda_max_reserved,
            reserved_now=use[0] if use else None,
            device_used=use[1] if use else None,
            device_total=use[2] if use else None,
        )
        changed = model != self.last
        self.last = model
        return memory_line(memory) if changed else None
