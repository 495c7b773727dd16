"""
Step clocks
===========

The always-on, per-batch measurements: when each batch started and ended, how many samples it had, and
its loss. A few clock reads and list appends per batch; no profiler, no device synchronization.

How the split is measured, for each batch ``k`` of a stage's epoch:

- **data wait**: from the end of batch ``k - 1`` (``on_*_batch_end``; for the first batch, the epoch start)
  to the start of batch ``k`` (``on_*_batch_start``). Lightning fetches the batch from the DataLoader and
  moves it to the device in between, so this is the time the loop waited for input.
- **compute**: from the start to the end of batch ``k``: forward, backward, optimizer step and the hooks; a
  training batch's split into those from the marks of Lightning's hooks (:mod:`lightning_perf.collect.phases`).
- A validation run inside a training epoch is neither: the clock restarts when it ends.
- **the batch after a window's close** is marked (:attr:`StepClock.after_close`) and left out of the epoch's
  times like a profiled batch: the close itself (the profiler stopping, torch exporting the trace) happens
  after its batch's end and before the clock restarts, but what it leaves behind (the trace's processing
  starting, the allocator and caches refilled) lands on the next batch, tens of ms on a small model.
- **the first batch's data wait** also holds what Lightning did before the epoch-start hook to start the
  DataLoader: it creates the iterator (starting worker processes, and for an ``IterableDataset`` fetching
  the first batch) before ``on_train_epoch_start`` in a fit's first epoch and before every
  ``on_validation_epoch_start``; :mod:`lightning_perf.collect.loops` times that and the caller passes it to
  :meth:`StepClock.epoch_start`.
- **CPU use during the wait**: over the data wait of every ``CPU_SAMPLE_EVERY``-th batch (batches 1, 5, 9,
  ..., 61), then every ``CPU_SAMPLE_SPARSE``-th (65, 97, ...), the process's CPU time (all its threads; not its
  worker processes') and the time its main thread waited in the kernel's run queue for a CPU
  (:class:`~lightning_perf.collect.cpu.RunQueue`). The share of a wait spent on a CPU is the CPU time over the
  wait less that queueing: close to 1 when the training process loads the batch with its CPU, close to zero
  when it sleeps or blocks on workers, a disk or the network; the epoch's is the median over the sampled waits
  (:meth:`StepClock.loading_cpu_share`). A woken thread that queues for a CPU on a busy machine uses none
  meanwhile: counted as using one, a dataset sleeping 2 ms per item beside two CPU burners read "on the CPU"
  (44-58% of its waits, the queueing most of it) in half its epochs. A few microseconds per sampled batch (two
  system calls).

Accuracy on CUDA: all three are host-side times. The host may run ahead of the device by the kernels it has
queued, so a single batch's compute can be short and the next batch's data wait long (the host waits in
the DataLoader while the device catches up); over an epoch the sums are right, because the host cannot run
more than a bounded queue ahead (any ``.item()``, logging or the caching allocator makes it wait).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from lightning_perf.collect.cpu import RunQueue
from lightning_perf.collect.phases import PhaseMarks

# A stage keeps at most this many batch losses on their device before summing them into one there (no
# synchronization): a tensor per batch held to the epoch's end would hold a caching-allocator block each.
LOSS_FOLD = 256
# The CPU clock is read around every 4th batch's data wait (from batch 1: batch 0 holds the DataLoader's
# start-up) in an epoch's first 64 batches, then every 32nd: a share needs tens of samples, not a quarter of a long
# epoch's batches, and each sample (two system calls) came to about 8 us a batch, averaged, in a fit of 1-ms steps.
CPU_SAMPLE_EVERY = 4
CPU_SAMPLE_DENSE = 64
CPU_SAMPLE_SPARSE = 32


def loss_tensor(outputs: Any) -> Any:
    """The loss a ``*_step`` returned: the tensor itself, or the ``"loss"`` entry of a mapping; else ``None``."""
    if isinstance(outputs, dict):
        outputs = outputs.get("loss")
    if hasattr(outputs, "detach") and getattr(outputs, "ndim", None) == 0:
        return outputs
    return None


class StepClock:
    """Per-batch times, sizes and losses of one stage, for the current epoch.

    Args:
        batch_size: Returns the number of samples in a batch, or ``None`` when it cannot tell.
        keep_loss: Keep each batch's loss (what its step returned) for the epoch's mean and :attr:`last_loss`.
        clock: Seconds, monotonic (``time.perf_counter``).
        cpu_clock: The process's CPU time, cumulative seconds (``time.process_time``).
        queue_clock: The seconds, cumulative, the main thread waited for a CPU
            (:class:`~lightning_perf.collect.cpu.RunQueue`); ``None`` where that cannot be read.
    """

    def __init__(
        self,
        batch_size: Callable[[Any], int | None],
        *,
        keep_loss: bool = True,
        clock: Callable[[], float] = time.perf_counter,
        cpu_clock: Callable[[], float] = time.process_time,
        queue_clock: Callable[[], float | None] | None = None,
    ):
        self._batch_size = batch_size
        self.keep_loss = keep_loss
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._queue_clock = queue_clock or RunQueue()
        self._last_end = clock()
        # Set when the coming batch's wait is sampled: the CPU and queue clocks at its start.
        self._last_end_cpu: tuple[float, float | None] | None = None
        self._start = self._last_end
        self.data_wait: list[float] = []
        self.sampled_wait = 0.0  # wall seconds of the sampled batches' data waits
        self.sampled_wait_cpu = 0.0  # the process's CPU seconds during them
        self.sampled_wait_queued = 0.0  # the seconds the main thread waited for a CPU during them
        self.sampled_on_cpu: list[float] = []  # each sampled wait's share on a CPU (loading_cpu_share)
        self.compute: list[float] = []
        self.batch_sizes: list[int | None] = []
        self.profiled: list[bool] = []  # the batch ran inside a profiler window (warm-up or recording)
        self.after_close: list[int] = []  # the batches that came right after a window's close
        self.epoch_starts: list[int] = [0]  # where each epoch measured with the others starts (a carried one's)
        self.losses: list[Any] = []  # detached 0-d tensors, still on their device, not yet summed
        self.last_loss: Any = None  # this batch's, or None
        self._loss_sum: Any = None  # the earlier losses of the epoch, summed on their device
        self._loss_count = 0
        self.phase_marks = PhaseMarks(clock)  # each training batch's forward, backward, optimizer and other

    def epoch_start(self, waited: float = 0.0, *, carried: bool = False) -> None:
        """Starts an epoch's clocks.

        Args:
            waited: Seconds Lightning already spent starting the DataLoader before the epoch-start hook,
                counted in the first batch's data wait.
            carried: The stage's last epoch was carried into this one, to be measured with it
                (:mod:`~lightning_perf.hooks.epoch_report`, Notes 2): its batches are kept, and this epoch's
                first batch is marked in :attr:`epoch_starts`.
        """
        self._last_end = self._clock() - waited
        self._last_end_cpu = None
        if carried:
            self.epoch_starts.append(len(self.data_wait))
            return
        self.epoch_starts = [0]
        self.data_wait, self.compute, self.batch_sizes, self.profiled, self.losses = [], [], [], [], []
        self.after_close = []
        self.phase_marks.reset()
        self.sampled_wait = self.sampled_wait_cpu = self.sampled_wait_queued = 0.0
        self.sampled_on_cpu = []
        self._loss_sum, self._loss_count = None, 0

    def restart(self, *, after_close: bool = False) -> None:
        """Restarts the data-wait clock (after the batch's own work, or a validation run inside a training
        epoch); ``after_close``: a window closed since the batch ended, and the next batch is marked."""
        if after_close:
            self.after_close.append(len(self.compute))
        self._last_end = self._clock()
        n = len(self.compute)
        every = CPU_SAMPLE_EVERY if n < CPU_SAMPLE_DENSE else CPU_SAMPLE_SPARSE
        self._last_end_cpu = (self._cpu_clock(), self._queue_clock()) if n % every == 1 else None

    def batch_start(self, batch: Any, profiled: bool = False) -> None:
        now = self._clock()
        if self._last_end_cpu is not None:
            cpu, queued = self._last_end_cpu
            wall, used, waited = now - self._last_end, self._cpu_clock() - cpu, 0.0
            if queued is not None and (queued_now := self._queue_clock()) is not None:
                waited = min(max(queued_now - queued, 0.0), wall)
            self.sampled_wait += wall
            self.sampled_wait_cpu += used
            self.sampled_wait_queued += waited
            self.sampled_on_cpu.append(used / max(wall - waited, used, 1e-9))
            self._last_end_cpu = None
        self.data_wait.append(now - self._last_end)
        self._start = now
        self.phase_marks.batch_start(now)
        self.batch_sizes.append(self._batch_size(batch))
        self.profiled.append(profiled)

    def window_data_wait(self) -> float | None:
        """The mean data wait of the latest batches a window recorded (the profiled ones at the end of the
        epoch's list so far); ``None`` where the latest batch was not profiled."""
        n = 0
        for profiled in reversed(self.profiled):
            if not profiled:
                break
            n += 1
        return sum(self.data_wait[-n:]) / n if n else None

    def batch_end(self, outputs: Any) -> None:
        """Ends the batch's compute time and keeps the loss in ``outputs``; the caller then does its own per-batch
        work and :meth:`restarts <restart>` the data-wait clock, so that this work is no part of the next batch's
        data wait."""
        now = self._clock()
        self.compute.append(now - self._start)  # (the caller restarts the data-wait clock)
        self.phase_marks.batch_end(now)
        self.last_loss = None
        if self.keep_loss:
            loss = outputs.get("loss") if type(outputs) is dict else outputs
            if type(loss) is not torch.Tensor or loss.ndim:  # read in this frame where it is a plain 0-d tensor
                loss = loss_tensor(outputs)
            if loss is not None:
                # Lightning hands on_train_batch_end an already detached loss, and eval steps run without
                # grad: detach (a new tensor) only when the graph would otherwise be kept alive.
                self.last_loss = loss.detach() if loss.requires_grad else loss
                self.losses.append(self.last_loss)
                if len(self.losses) >= LOSS_FOLD:
                    self._fold_losses()

    def _fold_losses(self) -> None:
        total = torch.stack(self.losses).float().sum()
        self._loss_sum = total if self._loss_sum is None else self._loss_sum + total
        self._loss_count += len(self.losses)
        self.losses = []

    def drop_unfinished(self) -> None:
        """Forgets a batch that started and never ended (an interruption inside it): an epoch's summary is
        over whole batches."""
        n = len(self.compute)
        del self.data_wait[n:], self.batch_sizes[n:], self.profiled[n:]

    @property
    def batches(self) -> int:
        return len(self.compute)

    def left_out(self, compiled: Iterable[int] = ()) -> list[bool]:
        """Per batch of the epoch, whether it is left out of the epoch's times: it ran in a profiler window or was
        counted (:attr:`profiled`); like those, a batch that ``compiled`` (torch.compile: its step holds seconds
        of compiling, a one-off cost the compile numbers report), and a batch after a window's close, which holds
        what the close left behind (:attr:`after_close`)."""
        steps = set(self.after_close) | set(compiled)
        return [profiled or i in steps for i, profiled in enumerate(self.profiled)]

    def loading_cpu_share(self) -> float | None:
        """The median over the sampled data waits of the process's CPU seconds over the wait's wall seconds less
        those its main thread waited for a CPU (at most 1); ``None`` without any.

        Notes:
            1. Less the queueing: a woken thread that queues for a CPU uses none meanwhile.
            2. The median, not the sums' ratio: ``schedstat``'s queueing may land in a later wait than its own (read
               beside three CPU burners on 2 CPUs: 10-30 ms of queueing in a wait of 0.7-1 ms all on a CPU, and a
               30-40 ms wait with 2 ms on a CPU and none counted). An in-memory dataset's waits there were mostly
               0.5-1 ms, all on a CPU: their sums read 8-30% "on the CPU", the median 100%.
        """
        return statistics.median(self.sampled_on_cpu) if self.sampled_on_cpu else None

    def loading_queue_share(self) -> float | None:
        """The seconds the main thread waited for a CPU over the sampled data waits (at most 1); ``None`` without
        any."""
        return min(self.sampled_wait_queued / self.sampled_wait, 1.0) if self.sampled_wait > 0 else None

    def mean_loss(self) -> float | None:
        """The mean of the epoch's losses: one device synchronization, at the epoch's end."""
        if self.losses:
            self._fold_losses()
        if not self._loss_count:
            return None
        return float(self._loss_sum) / self._loss_count
