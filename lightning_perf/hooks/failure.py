"""
What a failed run leaves
========================

When an exception ends a Trainer call (``on_exception``) and it is an out-of-memory error: where it happened (the
stage in its epoch, the batch and its shapes), what memory held then (:class:`MemoryTracking`'s count, the CUDA
peaks of the failing epoch), and the ``out_of_memory`` finding with the cures predicted to fit
(:mod:`lightning_perf.diagnose.out_of_memory`). All of it goes in ``run.out_of_memory`` and ``run.memory``, written
with the report the interruption writes anyway; the finding joins the failing epoch's findings. The user's
exception propagates unchanged, and nothing here allocates device memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl

from lightning_perf.collect.memory import CudaPeaks
from lightning_perf.collect.oom import batch_shapes, failed_batch, is_out_of_memory, message_sizes
from lightning_perf.diagnose.model import Finding
from lightning_perf.diagnose.out_of_memory import out_of_memory_finding
from lightning_perf.hooks.memory_tracking import MemoryTracking
from lightning_perf.hooks.window_control import StagePosition
from lightning_perf.records import plain

# Stages nested in another's epoch first: a validation run inside a training epoch is where a failure happened.
_INNERMOST = ("validate", "test", "predict", "train")


def out_of_memory(
    trainer: pl.Trainer,
    exception: BaseException,
    stages: Mapping[str, Any],
    positions: Mapping[str, StagePosition],
    memory: MemoryTracking,
    cuda_peaks: CudaPeaks | None,
    run_info: dict[str, Any],
) -> Finding | None:
    """The ``out_of_memory`` finding for ``exception``, its record put in ``run_info``; ``None`` (and nothing
    recorded) for any other exception. ``stages``: each stage's measure (its ``in_epoch``: inside an epoch)."""
    if not is_out_of_memory(exception):
        return None
    stage = next((s for s in _INNERMOST if s in stages and stages[s].in_epoch), "train")
    position = positions.get(stage)
    epoch = position.epoch if position is not None and position.epoch >= 0 else trainer.current_epoch
    message = str(exception)
    first_line = message.strip().split("\n", 1)[0]
    requested, free = message_sizes(message)
    record: dict[str, Any] = {
        "stage": stage,
        "epoch": epoch,
        "batch": position.batch if position is not None else None,
        "error": f"{type(exception).__name__}: {first_line}",
        "batch_shapes": batch_shapes(failed_batch(exception)),
        "requested": requested,
        "free": free,
    }
    peaks = cuda_peaks.read(stage) if cuda_peaks is not None else None
    breakdown = memory.at_failure(trainer, epoch, peaks, run_info)
    found = out_of_memory_finding(
        record,
        breakdown,
        world_size=trainer.world_size,
        precision=run_info.get("precision"),
        manual=run_info.get("manual_optimization"),
    )
    run_info["out_of_memory"] = {**record, "finding": plain(found)}
    return found
