"""
Window plans
============

Which batches of an epoch the profiler warms up on and records, as pure functions of the batch index.

A plan is data, separate from the machinery that acts on it (as :func:`torch.profiler.schedule` is):
:class:`~lightning_perf.collect.profiler.ProfilerWindow` does what the plan says, and the tests compare
:class:`CyclePlan` with ``torch.profiler.schedule`` for the same numbers.
"""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from lightning_perf.config import PerfConfig, Schedule


class Action(enum.Enum):
    """What the profiler does during one batch; the same four states as ``torch.profiler.ProfilerAction``."""

    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


class WindowPlan(Protocol):
    """A plan: the action for each batch index of an epoch, given how many batches it has."""

    def action(self, batch: int, num_batches: float = math.inf) -> Action:
        """The action for batch ``batch`` (0-based) of an epoch of ``num_batches`` (``inf``: unknown)."""

    def first_active(self) -> int | None:
        """The first batch any window records, or ``None`` if the plan records nothing."""

    def next_action(self, batch: int, num_batches: float = math.inf) -> float:
        """The first batch from ``batch`` on whose action is not ``NONE`` (``inf``: none in the epoch): the
        batches before it need no look at the plan."""


@dataclass(frozen=True)
class CyclePlan:
    """``torch.profiler.schedule`` semantics, restarted at every epoch.

    Notes:
        1. Batches ``< skip_first`` do nothing.
        2. The rest fall into cycles of ``wait`` (nothing), ``warmup`` and ``active`` batches; the last
           active batch of a cycle is ``RECORD_AND_SAVE``.
        3. After ``repeat`` cycles (if ``repeat > 0``) nothing more happens in the epoch.
        4. With ``repeat == 0`` and a known epoch length, a cycle whose active batches would not all fit
           is not started ("as many cycles as the epoch allows"); a window cut by an epoch of unknown
           length is saved short by the caller.
    """

    schedule: Schedule

    def action(self, batch: int, num_batches: float = math.inf) -> Action:
        s = self.schedule
        if batch < s.skip_first:
            return Action.NONE
        step = batch - s.skip_first
        cycle_index, pos = divmod(step, s.cycle)
        if s.repeat > 0 and cycle_index >= s.repeat:
            return Action.NONE
        if s.repeat == 0 and batch - pos + s.cycle > num_batches:
            return Action.NONE
        if pos < s.wait:
            return Action.NONE
        if pos < s.wait + s.warmup:
            return Action.WARMUP
        return Action.RECORD if pos < s.cycle - 1 else Action.RECORD_AND_SAVE

    def first_active(self) -> int | None:
        return self.schedule.skip_first + self.schedule.wait + self.schedule.warmup

    def next_action(self, batch: int, num_batches: float = math.inf) -> float:
        s = self.schedule
        batch = max(batch, s.skip_first)
        cycle_index, pos = divmod(batch - s.skip_first, s.cycle)
        start = batch - pos  # of the batch's cycle: later cycles end later still (Notes 3 and 4)
        if (s.repeat > 0 and cycle_index >= s.repeat) or (s.repeat == 0 and start + s.cycle > num_batches):
            return math.inf
        return max(batch, start + s.wait)


@dataclass(frozen=True)
class BatchListPlan:
    """Record exactly the listed batches, each run of consecutive indices as one window.

    Each window is preceded by up to ``warmup`` warm-up batches; the warm-up is shortened where it would
    overlap the previous window (a listed batch is never skipped to make room for another's warm-up).
    """

    batches: Sequence[int]
    warmup: int

    @functools.cached_property
    def windows(self) -> list[tuple[int, int, int]]:
        """(warmup start, first recorded, last recorded) for each window, in order."""
        windows: list[tuple[int, int, int]] = []
        for b in sorted(set(self.batches)):
            if windows and b == windows[-1][2] + 1:
                start, first, _ = windows[-1]
                windows[-1] = (start, first, b)
                continue
            floor = windows[-1][2] + 1 if windows else 0
            windows.append((max(b - self.warmup, floor), b, b))
        return windows

    def action(self, batch: int, num_batches: float = math.inf) -> Action:
        for start, first, last in self.windows:
            if batch < start:
                return Action.NONE
            if batch < first:
                return Action.WARMUP
            if batch <= last:
                return Action.RECORD_AND_SAVE if batch == last else Action.RECORD
        return Action.NONE

    def first_active(self) -> int | None:
        return self.windows[0][1] if self.windows else None

    def next_action(self, batch: int, num_batches: float = math.inf) -> float:
        for start, _, last in self.windows:
            if batch <= last:
                return max(batch, start)
        return math.inf


def make_plan(config: PerfConfig) -> WindowPlan:
    """The plan a config asks for: its ``batches`` list if given, else its ``schedule``."""
    if config.batches is not None:
        return BatchListPlan(config.batches, config.schedule.warmup)
    return CyclePlan(config.schedule)
