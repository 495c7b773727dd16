"""
Memory tracking
===============

When the callback counts what the model holds (:func:`~lightning_perf.collect.model_memory.model_memory`): after
each training epoch's first batch, where that step's gradients and the optimizer state exist (Lightning sets the
gradients to ``None`` before the next step's backward, and before every validation run: an epoch's end is too
late). Once an epoch it reads a cheap signature of them (:func:`~lightning_perf.collect.model_memory.
memory_signature`) and counts again only where it changed; never on other batches. At the epoch's
end the count joins the epoch's CUDA peaks in ``run.memory``; the console says it the first time and whenever the
model's part changes (a new optimizer, layers frozen or unfrozen). Under gradient accumulation the first batch
has not stepped the optimizer yet: its state shows from the next epoch's count.
"""

from __future__ import annotations

import os
from typing import Any

import lightning.pytorch as pl

from lightning_perf.collect.empty_cache import EmptyCacheCounter
from lightning_perf.collect.memory import CudaMemory, device_use, history_snapshot, record_history
from lightning_perf.collect.model_memory import memory_signature, model_memory
from lightning_perf.hooks.flop_count import FlopCounting
from lightning_perf.records import EpochSummary, ModelMemory, WindowRecord
from lightning_perf.report.memory import memory_line
from lightning_perf.summarize.memory import largest_allocations, memory_report

SNAPSHOT_FILE = "memory_snapshot.pickle"  # beside perf_report.json; open it at pytorch.org/memory_viz


class MemoryTracking:
    """The model's memory, counted after each training epoch's first batch and reported at the epoch's end."""

    def __init__(self, flops: FlopCounting | None = None) -> None:
        self._flops = flops  # its counted batch names the blocks that make the most activations
        self.due = False  # the epoch's first training batch is still to be counted
        self.empty_cache = EmptyCacheCounter()  # calls of torch.cuda.empty_cache() in the training epoch
        self.recording = False  # the CUDA allocator's history is on (PerfCallback(memory_history=True))
        self.model: ModelMemory | None = None  # the latest count
        self._said: ModelMemory | None = None
        self._signature: tuple[Any, ...] | None = None
        # The training windows' largest CPU forward peak (profile_memory=True) and its window's name.
        self.forward_peak: tuple[int, str] | None = None

    def epoch_start(self, *, history: bool = False) -> None:
        """A training epoch starts: its first batch is to be counted, and its ``empty_cache`` calls; with
        ``history``, the CUDA allocator's history is recorded from now (once)."""
        self.due = True
        self.empty_cache.install()
        self.empty_cache.reset()
        if history and not self.recording:
            self.recording = record_history(True)

    def oom_snapshot(self, run_info: dict[str, Any], report_path: str | None) -> None:
        """After an out-of-memory error (``run_info["out_of_memory"]``), with the history recorded: the allocator's
        snapshot saved beside the report (``memory_snapshot.pickle``) and its largest live allocations by call
        site in the report."""
        failure = run_info.get("out_of_memory")
        if not (self.recording and failure is not None and report_path):
            return
        path = os.path.join(os.path.dirname(report_path), SNAPSHOT_FILE)
        if (snapshot := history_snapshot(path)) is not None:
            failure["snapshot"], failure["largest_allocations"] = path, largest_allocations(snapshot)

    def end(self) -> None:
        """A Trainer call ends: ``torch.cuda.empty_cache`` is put back, the allocator's history stopped."""
        self.empty_cache.uninstall()
        if self.recording:
            self.recording = not record_history(False)

    def empty_cache_warning(self, summary: EpochSummary) -> str | None:
        """The warning for a training epoch that called ``torch.cuda.empty_cache()`` at least once a batch."""
        calls, batches = self.empty_cache.calls, summary.batches
        if batches < 2 or calls < batches:
            return None
        return (
            f"PerfCallback: torch.cuda.empty_cache() was called {calls} times in training epoch {summary.epoch} of"
            f" {batches} batches: every step. On CUDA each call hands the allocator's cache back to the driver, so"
            " the next step allocates it again (time), and the reserved memory no longer shows fragmentation."
            " Remove the call; against fragmentation, set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`."
        )

    def window_saved(self, record: WindowRecord) -> None:
        """A saved window: a training window's CPU forward peak (``profile_memory=True``) measures the activations
        and temporaries off CUDA, the largest so far."""
        peak = record.summary.cpu_forward_peak if record.summary is not None else None
        if record.stage == "train" and peak is not None and (self.forward_peak is None or peak > self.forward_peak[0]):
            self.forward_peak = (peak, record.name)

    def count(self, trainer: pl.Trainer, *, again: bool = False) -> None:
        """Counts what the model holds now (after a training batch: its gradients and the optimizer state exist),
        where it may have changed since the last count (:func:`memory_signature`), or ``again``."""
        self.due = False
        module, optimizers = trainer.lightning_module, trainer.optimizers
        signature = memory_signature(module, optimizers)
        if again or self.model is None or signature != self._signature:
            self.model, self._signature = model_memory(module, optimizers), signature

    def at_failure(
        self, trainer: pl.Trainer, epoch: int, peaks: CudaMemory | None, run_info: dict[str, Any]
    ) -> dict[str, Any]:
        """Counts what the model holds as a run fails (its gradients as far as the step got) and puts it, with the
        CUDA ``peaks`` of the failing epoch, in ``run_info["memory"]``; returns it."""
        self.count(trainer, again=True)
        assert self.model is not None
        allocated = (peaks.max_allocated, peaks.max_reserved) if peaks is not None else None
        run_info["memory"] = memory = self._breakdown(trainer, self.model, epoch, allocated)
        return memory

    def report(self, trainer: pl.Trainer, summary: EpochSummary, run_info: dict[str, Any]) -> str | None:
        """Puts the latest count, with the training epoch ``summary``'s CUDA peaks, in ``run_info["memory"]``;
        returns the console's line where the model's part is new or changed (``None`` where it is as before or
        nothing was counted)."""
        model = self.model
        if model is None:
            return None
        peaks = None
        if summary.cuda_max_allocated is not None and summary.cuda_max_reserved is not None:
            peaks = (summary.cuda_max_allocated, summary.cuda_max_reserved)
        run_info["memory"] = memory = self._breakdown(trainer, model, summary.epoch, peaks)
        changed, self._said = model != self._said, model
        return memory_line(memory) if changed else None

    def _breakdown(
        self, trainer: pl.Trainer, model: ModelMemory, epoch: int, peaks: tuple[int, int] | None
    ) -> dict[str, Any]:
        """:func:`memory_report` of ``model`` with the CUDA ``(allocated, reserved)`` peaks, the device's use now,
        what the FLOP-counted batch saved for its backward, and the training windows' CPU forward peak."""
        device = trainer.strategy.root_device
        use = device_use(device) if device.type == "cuda" else None
        flops = self._flops
        return memory_report(
            model,
            epoch=epoch,
            peak_allocated=peaks[0] if peaks else None,
            peak_reserved=peaks[1] if peaks else None,
            reserved_now=use[0] if use else None,
            device_used=use[1] if use else None,
            device_total=use[2] if use else None,
            blocks=flops.blocks if flops is not None else (),
            saved=flops.saved if flops is not None else None,
            forward_peak=self.forward_peak,
        )
