"""
FLOP counting
=============

When the callback counts a training batch's FLOPs (:class:`~lightning_perf.collect.flops.BatchFlopCounter`),
and what it keeps of the counts.

Notes:
    1. One batch per training epoch is a candidate: the first one after the epoch's first (whose data wait holds
       the DataLoader's start-up, which a counted batch would take out of the epoch) that runs outside a
       profiler window and that the budget lets run (Notes 2). It is counted when its shapes are new (at most
       :data:`~lightning_perf.collect.flops.MAX_COUNTS` shapes per run), so a run of fixed shapes counts one
       batch, and the check costs one comparison a batch. Where an epoch ended with no batch after its first
       (epochs of one batch each: some libraries count series, not samples, in an epoch), the next epoch offers
       its first batch, so that such runs are counted once too.
    2. **The budget.** A count costs about what a window does (every op of the batch goes through Python: 59 ms
       on a ``benchmarks/forecaster.py`` batch, against 83 ms for its training window), so it is one more
       profiling cost under ``profile_budget`` (:class:`~lightning_perf.budget.ProfilingBudget`), as issue 26
       asks, charged as a window's is (Notes 3). Where it runs:

       - ``PerfCallback(peak_flops=...)``: the user asked for MFU, so the first candidate is counted, whatever
         the budget says (issue 46: a 30-batch fit never showed the MFU it was asked for).
       - Else the count waits for the run's first training window, whose findings come first, and takes the
         first batch outside a window after its close (:meth:`FlopCounting.window_closed`) where the count fits
         the budget over the run's planned length (:func:`count_fits`), rather than over the time run so far:
         that batch is already left out of the epoch's times and charged to the budget (the window's processing
         runs beside it: :class:`~lightning_perf.collect.steps.StepClock`), so the count costs its own slowdown
         and takes no other batch from the epoch. A run planned long enough counts in its first epoch, where it
         waited for room before; a short run of a costly model still waits (on ``benchmarks/forecaster.py`` a
         count took 366 ms against a 97-ms step, 2% of a 4-epoch fit), and says why.
       - A run that plans no window (``max_windows=0``) has no first window to wait for, nor has an epoch too
         short for the plan (a run of short epochs counts in its first, before the window the plan moves into a
         later one: :mod:`~lightning_perf.hooks.window_control`, Notes 7), and one whose first training epoch
         opened none waits no longer after it: these count where the budget has room, as a later window opens
         (:meth:`~lightning_perf.budget.ProfilingBudget.allows`), batch after batch until there is some, and so
         do later counts (new shapes). A run too short to make room has no FLOP count: no FLOP/s, MFU or
         activations saved for the backward; each training epoch's console line says why
         (:meth:`FlopCounting.not_counted`) and the last line says so.

       Without a budget (``profile_budget=None``, or a plan of the user's) the first candidate is counted. A
       batch held back puts the next offer further on, twice as far each time up to :data:`HELD_STRIDE` batches
       (1, 2, 4, ... after it), and the callback compares the batch's index with :attr:`~FlopCounting.offer_from`,
       an integer: asked at every batch, the budget took 4.5 us of a 1-ms step in the fit (0.15-0.4% of a 10-s
       run of such steps that never made room), and a count that waits a few batches longer loses nothing.
    3. A counted batch runs slower (every op goes through Python): like a profiled batch, it is left out of the
       epoch's step times, and what it took beyond the epoch's median step is charged to the budget.
    4. The peak FLOP/s come from ``PerfCallback(peak_flops=...)``, else from the datasheet table
       (:func:`lightning_perf.peak_flops`) for a CUDA device and the run's dtype.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from torch import nn

from lightning_perf.budget import ProfilingBudget
from lightning_perf.collect.activations import SavedSizes
from lightning_perf.collect.flops import BatchFlopCounter, BatchFlops
from lightning_perf.collect.steps import StepClock
from lightning_perf.hooks.error_policy import ErrorPolicy
from lightning_perf.peak_table import dtype_for, peak_flops
from lightning_perf.summarize.flops import FlopCount
from lightning_perf.units import limit


def run_peak_flops(run: dict[str, Any], override: float | None) -> float | None:
    """The peak FLOP/s MFU divides by: ``override``, else the table's dense figure for a CUDA device's name
    and the run's dtype (its precision, and ``float32_matmul_precision`` for TF32), ``None`` where unknown."""
    if override is not None:
        return override
    if run.get("device") != "cuda" or not run.get("device_name"):
        return None
    try:
        dtype = dtype_for(run.get("precision"), run.get("float32_matmul_precision", "highest"))
    except ValueError:  # a precision plugin of the user's: no known dtype
        return None
    return peak_flops(run["device_name"], dtype) if dtype is not None else None


HELD_STRIDE = 16
"""The most batches between two offers of a count the budget holds back (Notes 2): at most this many batches late
once the budget has room. Our judgment."""

NEVER = sys.maxsize
""":attr:`FlopCounting.offer_from` where no batch of the epoch is to be offered."""

COUNT_STEPS = 3.0
"""What a counted batch costs beyond its step, in steps (:func:`count_fits`): every op goes through Python under
``FlopCounterMode``, and the saved-tensor hooks name what the backward keeps: 366 ms against a 97-ms step on a
``benchmarks/forecaster.py`` batch (2.8 steps; 2-CPU machine, one thread). Measured."""


def count_fits(share: float | None, spent: float, step: float, planned_batches: float) -> bool:
    """Whether a count fits the budget over the run's plan (Notes 2): what the profiling has cost so far
    (``spent``, seconds) and a count (:data:`COUNT_STEPS` steps of ``step`` seconds, the median so far) within
    ``share`` of ``planned_batches`` such steps (the training batches the Trainer plans; ``inf``: no end
    planned). No budget (``share`` ``None``): it fits."""
    if share is None or math.isinf(planned_batches):
        return True
    return spent + COUNT_STEPS * step <= share * planned_batches * step


UNCOUNTED_NAMED = 4
"""Ops with no FLOP formula named in the warning (:func:`uncounted_warning`), most calls first."""


def uncounted_warning(record: BatchFlops) -> str | None:
    """The warning for a count that left out matrix work (ops with no FLOP formula, e.g. an LSTM on CPU), naming
    the ops; ``None`` where nothing was left out."""
    if not record.uncounted:
        return None
    named = ", ".join(f"{op} ({calls} calls)" for op, calls in record.uncounted[:UNCOUNTED_NAMED])
    more = f" and {len(record.uncounted) - UNCOUNTED_NAMED} more" if len(record.uncounted) > UNCOUNTED_NAMED else ""
    return (
        f"PerfCallback: the FLOP count leaves out {named}{more}: torch's FlopCounterMode has no formula for them,"
        " so they count 0, and FLOPs per batch, FLOP/s and MFU are lower bounds."
    )


def keep_count(run_info: dict[str, Any], counts: list[FlopCount], record: BatchFlops, policy: ErrorPolicy) -> None:
    """A training batch's FLOPs were counted: the run's counts and top modules go in ``run_info["flops"]``; the ops
    left out are warned of once; where no peak is known, one note says how to give it."""
    kept = run_info.get("flops", {})  # the shares are of the first counted batch
    uncounted = dict(kept.get("uncounted", []))
    for op, calls in record.uncounted:
        uncounted[op] = max(calls, uncounted.get(op, 0))
    run_info["flops"] = {
        "by_module": kept.get("by_module", [[name, flops] for name, flops in record.by_module]),
        "forward": kept.get("forward", record.forward),
        "counted": [{"flops": c.flops, "samples": c.samples} for c in counts],
        "uncounted": [[op, calls] for op, calls in uncounted.items()],
    }
    if message := uncounted_warning(record):
        policy.warn_once("flops_uncounted", message)
    if run_info.get("peak_flops") is None:
        policy.info_once(
            "peak_flops",
            f"PerfCallback: FLOPs are counted, but no peak FLOP/s is known for {run_info.get('device_name')}"
            f" ({run_info.get('precision')}), so MFU is not computed: pass `PerfCallback(peak_flops=...)`,"
            " the device's peak FLOP/s for the run's dtype.",
        )


class FlopCounting:
    """The run's FLOP counts: which batch to count (one candidate per training epoch, within the budget), and the
    counts.

    Args:
        batch_size: What counts a batch's samples (:class:`~lightning_perf.collect.flops.BatchFlopCounter`).
        budget: The run's profiling budget, which a count waits for (Notes 2); ``None``: none.
        windows_planned: Whether the run plans profiler windows, the first of which a count waits for.
        asked: The user gave ``peak_flops``: the first candidate is counted whatever the budget says (Notes 2).
        clock: Seconds, monotonic (the budget's clock).

    Example::

        counting.epoch_start()
        counted = counting.batch_start(batch, batch_idx)  # True: being counted (leave it out of times)
        record = counting.batch_end()  # a BatchFlops when it was
    """

    def __init__(
        self,
        batch_size: Callable[[Any], int | None] | None = None,
        budget: ProfilingBudget | None = None,
        *,
        windows_planned: bool = True,
        asked: bool = False,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._counter = BatchFlopCounter(batch_size=batch_size)
        self._budget = budget if budget is not None and budget.share is not None else None
        self._wait_for_window = windows_planned
        # The next offer is counted whatever the budget says: the user asked for MFU, or the first training window
        # has just closed (Notes 2); spent by the first count.
        self._free = asked
        self._window_closed = False  # a training window has closed (the one the count waits for)
        self._clock = clock
        #: The first batch index of this training epoch to offer for counting (:data:`NEVER`: none); a plain
        #: attribute, which the callback compares with every batch's index (Notes 2).
        self.offer_from = NEVER
        self._stride = 1  # how far the next offer goes after a batch held back for the budget (Notes 2)
        #: The counts, for :func:`~lightning_perf.summarize.flops.epoch_flops`.
        self.counts: list[FlopCount] = []
        #: A batch is being counted (a plain attribute: the callback reads it after every batch).
        self.active = False
        self._last_offered = 0  # the last batch of this epoch offered
        self._saved = SavedSizes()  # what the counted batch saves for its backward, by module (the first count)
        #: The blocks that save the most for the backward, ``(name, bytes)``, from the first count.
        self.blocks: tuple[tuple[str, int], ...] = ()
        #: The bytes that batch saved for the backward in all (its activations); ``None`` before.
        self.saved: int | None = None

    @property
    def pending(self) -> bool:
        """A batch of this training epoch is still to be offered for counting."""
        return self.offer_from != NEVER

    def epoch_start(self, *, window_ahead: bool = True) -> None:
        """A training epoch starts: its first batch outside a window is offered (Notes 1); ``window_ahead``: the
        epoch may open a window (``False``: too short for the plan, the count waits for none)."""
        # Still pending: the last epoch counted nothing, and may have offered nothing after its first batch.
        first_too = self.pending and self._last_offered == 0
        if self.pending or not window_ahead:
            self._wait_for_window = False  # a first epoch that opened no window: the count waits no longer
        self.offer_from = 0 if first_too else 1
        self._stride = 1
        self._last_offered = 0

    def batch_start(self, batch: Any, batch_idx: int) -> bool:
        """Offers batch ``batch_idx`` of the epoch (call only from :attr:`offer_from` on, outside a window);
        whether it is being counted. The epoch's first batch is not offered, unless the last epoch had no other
        (Notes 1); a batch the budget holds back puts the next offer further on (Notes 2)."""
        self._last_offered = batch_idx
        if not self._budget_allows():
            self._hold(not self.counts)  # a later count (a new shape) held back leaves the run its FLOPs
            self.offer_from = batch_idx + self._stride
            self._stride = min(2 * self._stride, HELD_STRIDE)
            return False
        self.offer_from = NEVER
        self._hold(False)
        self._free = False
        if not self._counter.wants(batch):
            return False
        self._counter.start(batch)
        if not self.counts:
            self._saved.start()
        self.active = True
        return True

    @property
    def held(self) -> bool:
        """A candidate was held back for the budget, and no batch has been counted since (Notes 2): the budget's
        :attr:`~lightning_perf.budget.ProfilingBudget.flops_held`, which its last line reads."""
        return self._budget is not None and self._budget.flops_held

    def window_closed(self, next_batch: int, *, fits: bool = True) -> None:
        """The run's first training window closed at the end of the epoch's batch ``next_batch - 1``: where the
        run's FLOPs are not counted yet and the count ``fits`` the budget over the run's plan
        (:func:`count_fits`), the next batch outside a window is offered, whatever the budget says now (Notes 2)."""
        if self._window_closed:
            return
        self._window_closed = True
        if self.counts or not fits:
            return
        self._free = True
        self.offer_from = min(self.offer_from, next_batch)
        # The epoch had a batch after its first: the next epoch's first is not offered (Notes 1).
        self._last_offered = max(self._last_offered, next_batch - 1)

    def not_counted(self) -> str | None:
        """``"FLOPs not counted yet: "`` and why (:meth:`not_counted_why`), for a training epoch's console line."""
        why = self.not_counted_why()
        return None if why is None else f"FLOPs not counted yet: {why}"

    def not_counted_why(self) -> str | None:
        """Why the run's FLOPs are not counted yet; ``None`` where they are, or where no count is to come (Notes
        2)."""
        if self.counts or not self.pending:
            return None
        budget = None if self._free else self._budget  # a free offer waits for nothing
        if budget is not None and self._wait_for_window and not budget.windows:
            return "they wait for the first profiler window"
        if budget is not None and budget.flops_held:
            return f"the profiling budget ({limit(budget.share or 0.0)}) had no room"
        if self._window_closed and self._free:
            return "they are counted on the next batch, after the profiler window"
        if self._last_offered == 0:
            return "an epoch's first batch is not counted (its data wait holds the DataLoader's start-up)"
        return None

    def _hold(self, held: bool) -> None:
        if self._budget is not None:
            self._budget.flops_held = held

    def _budget_allows(self) -> bool:
        """Whether the budget lets a count run now: after the run's first window, within the share (Notes 2)."""
        budget = self._budget
        if budget is None or self._free:
            return True
        if self._wait_for_window and not budget.windows:
            return False
        return budget.allows(self._clock())

    def batch_end(self, root: nn.Module | None = None) -> BatchFlops | None:
        """The counted batch's record, when one was being counted; ``root``: the module whose blocks are named
        (:attr:`blocks`)."""
        if self._saved.active and root is not None:
            self.blocks, self.saved = self._saved.stop(root), self._saved.total
        self._saved.cancel()
        if not self._counter.active:
            return None
        self.active = False
        record = self._counter.stop()
        self.counts.append(FlopCount(flops=record.total, samples=record.batch_size))
        return record

    def offer(self, batch: Any, batch_idx: int, policy: ErrorPolicy) -> bool:
        """:meth:`batch_start`, a failure cancelling the count and going to ``policy``: whether it is being
        counted."""
        try:
            return self.batch_start(batch, batch_idx)
        except Exception as err:
            self.cancel()
            policy.fail("train", err)
            return False

    def finish(self, root: nn.Module | None, run_info: dict[str, Any], policy: ErrorPolicy) -> None:
        """:meth:`batch_end`, the count kept in ``run_info`` (:func:`keep_count`), a failure cancelling it and going
        to ``policy``."""
        try:
            record = self.batch_end(root)
            if record is not None:
                keep_count(run_info, self.counts, record, policy)
        except Exception as err:
            self.cancel()
            policy.fail("train", err)

    def cancel(self) -> None:
        """Leaves a count under way, if any (an exception, the end of the run)."""
        self.active = False
        self._saved.cancel()
        self._counter.cancel()


def after_window(flops: FlopCounting, budget: ProfilingBudget, clock: StepClock, trainer: Any, next_batch: int) -> None:
    """A training window closed before the epoch's batch ``next_batch``: ``flops`` may take it, where a count fits
    ``budget`` over the fit's planned training batches (:func:`count_fits`, with the epoch's median step so far
    from ``clock``; Notes 2). Once per window, never per batch."""
    if flops.counts or budget.share is None:
        flops.window_closed(next_batch)
        return
    steps = [wait + work for wait, work in zip(clock.data_wait, clock.compute, strict=False)]
    max_epochs = trainer.max_epochs if trainer.max_epochs is not None else -1
    planned = trainer.num_training_batches * max_epochs if max_epochs >= 0 else math.inf
    if trainer.max_steps is not None and trainer.max_steps >= 0:
        planned = min(planned, trainer.max_steps)
    spent = budget.cost(time.perf_counter()).seconds
    fits = bool(steps) and count_fits(budget.share, spent, statistics.median(steps), planned)
    flops.window_closed(next_batch, fits=fits)
