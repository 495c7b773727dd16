"""
Profiling budget
================

What the profiling costs a run, and whether the next window may open: the plain logic behind
``PerfCallback(profile_budget=...)``. The schedule says *where* windows may open; the budget says *whether*
one opens now. No torch and no Lightning here: the callback feeds a :class:`ProfilingBudget` the Trainer
calls' wall time and each window's measured cost, and asks it before a window opens.

A window's cost is measured, not estimated (:func:`window_cost`): the training thread's stall at its close,
plus what its batches took beyond the stage's median step: the warm-up and recorded batches (the profiler
slows every operator) and the batches after the close while its trace was still being processed (in the
background, taking CPU time and caches from training). The FLOP count's batch (one per run, under
``FlopCounterMode``) is charged the same way, and asks the budget as a later window does
(:class:`~lightning_perf.hooks.flop_count.FlopCounting`, Notes 2).

Notes:
    1. A stage's first window opens as planned: the findings need one (the controller does not ask).
    2. A later one (or the FLOP count) opens only where the cost so far, plus one more window as costly as the
       mean so far, stays within ``share`` of the run's wall time by then: ``spent + mean <= share * (elapsed +
       mean)``. Over a long run the windows space themselves out so that the cost stays near the share.
    3. The run's wall time is the sum of its Trainer calls' (``fit``, ``validate``, ...), each from its setup to
       its teardown: what the user waits for.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from lightning_perf.records import WindowRecord


@dataclass(frozen=True)
class ProfilingCost:
    """What the profiling cost a run so far.

    Attributes:
        budget: The share of the run's wall time windows may cost (``None``: no budget; every planned window
            opens).
        seconds: What the windows, the FLOP count and the advice trials cost, measured (see :func:`window_cost`).
        run_seconds: The run's wall time so far: its Trainer calls', setup to teardown.
        windows: The windows that opened.
        skipped: The planned windows the budget did not open.
        flops_held: The budget has held the FLOP count back, and no batch has been counted since.
    """

    budget: float | None
    seconds: float
    run_seconds: float
    windows: int
    skipped: int
    flops_held: bool = False

    @property
    def share(self) -> float | None:
        """``seconds`` over ``run_seconds`` (``None`` before any wall time)."""
        return self.seconds / self.run_seconds if self.run_seconds > 0 else None


class ProfilingBudget:
    """The run's profiling cost against its budget.

    Args:
        share: The share of the run's wall time windows may cost; ``None``: no budget.
        warmup: The batches a window warms up on before its first recorded one (its cost too).

    Example::

        budget = ProfilingBudget(0.03)
        budget.call_started(time.perf_counter())
        if budget.allows(time.perf_counter()):
            budget.opened()  # ... and once the window's cost is measured:
            budget.charge(0.4)
    """

    def __init__(self, share: float | None, warmup: int = 1) -> None:
        self.share = share
        self.warmup = warmup
        self._closed_calls = 0.0  # wall seconds of the Trainer calls that ended
        self._call_started: float | None = None
        self._seconds = 0.0
        self._windows = 0
        self._skipped = 0
        #: The FLOP count is held back (set by :class:`~lightning_perf.hooks.flop_count.FlopCounting`).
        self.flops_held = False

    def call_started(self, now: float) -> None:
        """A Trainer call (``fit``, ``validate``, ...) starts at ``now`` (seconds, monotonic)."""
        self._call_started = now

    def call_ended(self, now: float) -> None:
        """The Trainer call ends at ``now``: its wall time counts in the run's."""
        if self._call_started is not None:
            self._closed_calls += max(now - self._call_started, 0.0)
            self._call_started = None

    @property
    def windows(self) -> int:
        """The windows opened so far."""
        return self._windows

    def elapsed(self, now: float) -> float:
        """The run's wall time at ``now``: its ended calls', and the current one's so far."""
        current = max(now - self._call_started, 0.0) if self._call_started is not None else 0.0
        return self._closed_calls + current

    def allows(self, now: float) -> bool:
        """Whether a window may open at ``now`` (see the module's notes)."""
        if self.share is None or self._windows == 0:
            return True
        mean = self._seconds / self._windows
        return self._seconds + mean <= self.share * (self.elapsed(now) + mean)

    def opened(self) -> None:
        """A window opened (its cost is charged once measured)."""
        self._windows += 1

    def skipped(self) -> None:
        """A planned window did not open: :meth:`allows` said no."""
        self._skipped += 1

    def charge(self, seconds: float) -> None:
        """Adds a measured cost (seconds; a negative measure, noise, counts as none)."""
        if math.isfinite(seconds):
            self._seconds += max(seconds, 0.0)

    def cost(self, now: float) -> ProfilingCost:
        """What the profiling cost the run by ``now``."""
        return ProfilingCost(
            budget=self.share,
            seconds=self._seconds,
            run_seconds=self.elapsed(now),
            windows=self._windows,
            skipped=self._skipped,
            flops_held=self.flops_held,
        )

    def state_dict(self, now: float) -> dict[str, float]:
        """Plain values at ``now``, for a checkpoint: a resumed fit goes on with what the run has spent, and the
        time it has run."""
        return {
            "seconds": self._seconds,
            "run_seconds": self.elapsed(now),
            "windows": self._windows,
            "skipped": self._skipped,
        }

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Restores :meth:`state_dict`'s values (missing keys, from an older checkpoint, count as 0)."""
        self._seconds = float(state.get("seconds", 0.0))
        self._closed_calls = float(state.get("run_seconds", 0.0))
        self._windows = int(state.get("windows", 0))
        self._skipped = int(state.get("skipped", 0))


def trial_fits(share: float | None, spent: float, estimate: float, run_seconds: float) -> bool:
    """Whether an advice trial of about ``estimate`` seconds fits the budget: what the profiling has cost so far
    (``spent``) and the trial within ``share`` of ``run_seconds`` (the run's wall time so far, or its plan where
    longer: :class:`~lightning_perf.hooks.advice_trials.AdviceTrials`). No budget (``share`` ``None``): it fits."""
    return share is None or spent + max(estimate, 0.0) <= share * run_seconds


def excess_time(step_times: Sequence[float], batches: Sequence[int], median: float) -> float:
    """What ``batches`` (indices into ``step_times``) took beyond ``median`` each: the cost of running them
    profiled, or in a window's wake. A batch faster than the median counts as none (noise)."""
    return sum(max(step_times[i] - median, 0.0) for i in batches if 0 <= i < len(step_times))


def window_cost(close_seconds: float, step_times: Sequence[float], batches: Sequence[int], median: float) -> float:
    """A window's measured cost: its close's stall on the training thread, plus its ``batches`` (its warm-up and
    recorded batches, and those after its close while its trace was processed) beyond the stage's ``median``
    step."""
    return max(close_seconds, 0.0) + excess_time(step_times, batches, median)


def window_costs(
    windows: Sequence[WindowRecord],
    step_times: Sequence[float],
    ours: Sequence[int],
    median: float,
    *,
    warmup: int,
    waited: float = 0.0,
) -> tuple[list[WindowRecord], float]:
    """A stage epoch's windows with their ``cost_seconds``, and the cost of the epoch's other batches of ours (the
    FLOP count's) beyond the ``median`` step.

    Args:
        windows: The epoch's windows.
        step_times: The epoch's step times, every batch.
        ours: The batches the profiling slowed: in a window (warm-up, recorded), counted, or after a close
            while a trace was processed.
        median: The epoch's median step over its other batches.
        warmup: The batches a window warms up on before its first recorded one (they are its too).
        waited: Seconds the epoch's end waited for the windows' processing: the last window's.

    Notes:
        A batch of ours belongs to the last window that started (warm-up included) at or before it; one before
        every window is the other cost.
    """
    ordered = sorted(windows, key=lambda w: w.first_batch)
    starts = [w.first_batch - warmup for w in ordered]
    batches: list[list[int]] = [[] for _ in ordered]
    other: list[int] = []
    for b in ours:
        owner = next((i for i in reversed(range(len(ordered))) if starts[i] <= b), None)
        (other if owner is None else batches[owner]).append(b)
    costed = [
        dataclasses.replace(
            w,
            cost_seconds=window_cost(w.close_seconds, step_times, mine, median)
            + (max(waited, 0.0) if i == len(ordered) - 1 else 0.0),
        )
        for i, (w, mine) in enumerate(zip(ordered, batches, strict=True))
    ]
    return costed, excess_time(step_times, other, median)
