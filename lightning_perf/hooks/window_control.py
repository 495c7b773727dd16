"""
Window control
==============

Which batches of each stage the profiler warms up on and records, and the one window open at a time: the
window semantics of "Windows, exactly" in docs/schedule.md, as plain code over any
:class:`~lightning_perf.collect.window.Window`. No Lightning and no ``torch.profiler`` here:
:class:`~lightning_perf.PerfCallback` calls a :class:`WindowControl` from its hooks and hands what it closes
to the per-window pipeline (:mod:`lightning_perf.hooks.window_close`); the tests drive one with a fake window.

Notes:
    1. Batches are counted per stage from 0 at each epoch start; the plan
       (:func:`~lightning_perf.schedule.make_plan`) says what each batch does.
    2. One window is open at a time: a window of another stage that the plan would open meanwhile (a
       validation run inside a training window) is skipped, with a note.
    3. A validation run inside a training window pauses it when it has recorded batches; a window that has
       not (still warming up) is dropped, and planned again after validation.
    4. A window still open when its stage's epoch ends is saved there, marked ``shortened``.
    5. A window that recorded nothing is dropped and does not count against ``max_windows``.
    6. With a :class:`~lightning_perf.budget.ProfilingBudget`, a stage's first window opens as planned and a later
       one only where the budget allows it when it would open; a planned window it does not open is skipped
       whole (not opened part-way at its next batch), with a note once per stage. Under several ranks the
       budget's verdict is the deciding rank's (:attr:`WindowControl.verdicts`,
       :class:`~lightning_perf.collect.verdicts.SharedVerdicts`), so that every window holds every rank.
    7. The default plan (not one the user chose) whose first recorded batch a stage's epochs never reach (a run of
       many short epochs) is moved into them: after an epoch too short for it, each of the stage's later epochs
       records its batch ``warmup`` (or its last), warmed up on those before, until the stage has a window; an
       epoch of unknown length (an ``IterableDataset``) is expected as long as the stage's last (one that ends
       sooner drops or shortens its window, as any epoch does). A stage's first epoch keeps the plan, so that a
       single short call (a forecasting library's predict call on a copy of the callback) pays no window. The
       moved window is the stage's first: it opens as planned (Notes 6).
    8. An epoch that may record no window (too short for the plan, no window left for the stage, or a process that
       records none) is quiet from its start: its batches, and the training batch after a validation run inside
       it, return at once, before any look at the plan (at every epoch of a run of short epochs).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from lightning_perf.budget import ProfilingBudget
from lightning_perf.collect.window import Window, WindowState
from lightning_perf.schedule import Action, BatchListPlan, WindowPlan
from lightning_perf.units import limit, percent

#: What is said once: the text, or what builds it, called only the first time (a message that a run of short
#: epochs would say at every epoch is built once).
Message = str | Callable[[], str]
#: ``(key, message)``: a message to show once per key (see :class:`~lightning_perf.hooks.error_policy.ErrorPolicy`;
#: the message, or what builds it).
Say = Callable[[str, Message], None]


class Verdicts(Protocol):
    """The ranks' shared budget verdicts (:class:`~lightning_perf.collect.verdicts.SharedVerdicts`)."""

    def agree(self, stage: str, epoch: int, batch: int, verdict: bool) -> bool: ...

    def ended(self, stage: str, epoch: int) -> None: ...


@dataclass
class StagePosition:
    """Where one stage is, as far as windows go.

    Attributes:
        epoch: The stage's current epoch (``-1`` before its first).
        batch: The batch within the epoch, from 0.
        num_batches: The epoch's batches (``inf``: unknown).
        windows_used: The windows the stage has opened in the run, against ``max_windows``.
        windows_this_epoch: The windows saved in the current epoch.
        quiet_until: The batches before this one the plan leaves alone (:meth:`WindowPlan.next_action`): the
            stage moves through them without a look at the plan.
        plan: This epoch's own plan, where the default one is moved into a short epoch (Notes 7); ``None``: the
            controller's.
        short_epochs: The stage's epochs so far too short for the plan to record in.
        last_batches: The batches of the stage's last epoch (the length a moved plan expects of an epoch of
            unknown length: Notes 7).
    """

    epoch: int = -1
    batch: int = 0
    num_batches: float = math.inf
    windows_used: int = 0
    windows_this_epoch: int = 0
    quiet_until: float = 0
    plan: WindowPlan | None = None
    short_epochs: int = 0
    last_batches: int = 0


@dataclass(frozen=True)
class OpenWindow:
    """The window open now: of which stage and epoch, and its step on the stage's axis (set when it starts
    recording)."""

    window: Window
    stage: str
    epoch: int
    step: int = 0


@dataclass(frozen=True)
class WindowToSave:
    """A window closed with recorded batches, for the per-window pipeline
    (:func:`~lightning_perf.hooks.window_close.hand_over`), which stops it and has its trace exported."""

    open: OpenWindow
    shortened: bool
    recorded: Sequence[int]


# How far either way the batches a window was planned to record are looked for (a window plans a few).
PLAN_REACH = 100_000


def planned_batches(plan: WindowPlan, first: int, last: int) -> tuple[int, int]:
    """The first and last batch the window that recorded ``first`` to ``last`` was planned to record, in an
    epoch of unknown length (an epoch's end cuts a window short of them)."""
    start = first
    while start > 0 and first - start < PLAN_REACH and plan.action(start - 1) is Action.RECORD:
        start -= 1
    end = last
    while end - last < PLAN_REACH and plan.action(end) is Action.RECORD:
        end += 1
    return start, end if plan.action(end) is Action.RECORD_AND_SAVE else max(end - 1, last)


def _cut_short(stage: str, planned: tuple[int, int], recorded: Sequence[int], stopped_in: bool) -> str:
    """The warning for a window cut short: what it was planned to record, what it did, and whether the run
    stopped inside its last batch (an exception, Ctrl-C)."""
    whole = recorded[:-1] if stopped_in else recorded
    held = [f"batches {whole[0]}-{whole[-1]}" if len(whole) > 1 else f"batch {whole[0]}"] if whole else []
    if stopped_in:
        held.append(f"batch {recorded[-1]} up to where the run stopped in it")
    return (
        f"PerfCallback: a {stage} window was cut short by the end of its epoch or of the run: of its planned"
        f" batches {planned[0]}-{planned[1]}, it recorded {' and '.join(held)}; its trace is saved as it is."
    )


class WindowControl:
    """Plans, opens, pauses and closes the profiler windows of every stage, one at a time.

    Args:
        plan: Which batches of an epoch to warm up on and record.
        max_windows: At most this many windows per stage per run.
        stages: The stages to keep positions for.
        new_window: ``(stage, epoch) -> Window``: a new window, or ``None`` when none can record now (the
            factory says why).
        started: ``(stage, context) -> step``: called when a window starts recording, with the ``context``
            the caller passed; returns the window's step on the stage's axis.
        warn, info: ``(key, message)``: what to show once per key, as a warning or as a note.
        chosen: The user chose the plan (a schedule or batches of their own): an epoch too short for it, or a
            window the epoch's end cuts short, is a warning; with the default plan, a note (a small validation
            set is no fault of the user's).
        budget: Whether a stage's later windows may open (``None``: all that are planned).
        clock: Seconds, monotonic, for the budget.
        warmup: The warm-up batches of a default plan moved into short epochs (Notes 7).

    The caller sets :attr:`records` (whether this process records windows at all) and calls, for each stage:
    :meth:`epoch_start`, then :meth:`before_batch`; per batch :meth:`batch_started` (only while a window of the
    stage is open), :meth:`end_step` and :meth:`next_batch`; at the epoch's end :meth:`close` and, once the
    epoch is reported, :meth:`epoch_end`. Around a validation run inside training: :meth:`validation_start` and
    :meth:`validation_end`. Each call that can close a window returns what it closed (:class:`WindowToSave`)
    or ``None``.

    Example::

        control = WindowControl(make_plan(config), max_windows=5, stages=STAGES, new_window=factory,
                                started=lambda stage, context: 0, warn=print_once, info=print_once)
        control.epoch_start("train", 8, epoch=0)
        control.before_batch("train", None)
    """

    def __init__(
        self,
        plan: WindowPlan,
        *,
        max_windows: int,
        stages: Iterable[str],
        new_window: Callable[[str, int], Window | None],
        started: Callable[[str, Any], int],
        warn: Say,
        info: Say,
        chosen: bool = True,
        budget: ProfilingBudget | None = None,
        clock: Callable[[], float] = time.perf_counter,
        warmup: int = 1,
    ) -> None:
        self.plan = plan
        self.max_windows = max_windows
        self.stages = {stage: StagePosition() for stage in stages}
        self.open: OpenWindow | None = None
        self.records = True
        self._new_window = new_window
        self._started = started
        self._warn = warn
        self._info = info
        self._unmet = warn if chosen else info  # the plan could not be kept: said as the plan's chooser expects
        self._chosen = chosen
        self._warmup = warmup  # a moved window's warm-up batches (Notes 7)
        self.budget = budget
        self._clock = clock
        self._denied: tuple[str, int, int] | None = None  # (stage, epoch, batch) the budget last kept closed
        #: Under several ranks, the verdicts every rank follows (Notes 6); ``None``: this rank's own.
        self.verdicts: Verdicts | None = None

    def epoch_start(self, stage: str, num_batches: float, *, epoch: int | None = None, first_batch: int = 0) -> bool:
        """A stage epoch of ``num_batches`` starts: epoch ``epoch``, or (``None``) the stage's next (validation
        runs, test and predict calls are numbered in order); at ``first_batch``, later than 0 when a run
        resumes mid-epoch. Returns whether the epoch may record a window (:meth:`may_record`); one that may not
        is quiet: its batches need no look at the plan (Notes 8)."""
        pos = self.stages[stage]
        pos.epoch = pos.epoch + 1 if epoch is None else epoch
        pos.batch, pos.num_batches, pos.windows_this_epoch = first_batch, num_batches, 0
        pos.plan = self._moved_plan(pos)
        records = self.may_record(stage)
        pos.quiet_until = 0 if records else math.inf
        return records

    def may_record(self, stage: str) -> bool:
        """Whether the stage's current epoch may record a window: the plan records in it (any epoch of unknown
        length may), on a process that records, with windows left."""
        pos = self.stages[stage]
        first = self._plan(pos).first_active()
        return self.records and pos.windows_used < self.max_windows and first is not None and first < pos.num_batches

    def _plan(self, pos: StagePosition) -> WindowPlan:
        """The plan of the stage's current epoch: its own where the default was moved into it (Notes 7)."""
        return pos.plan or self.plan

    def _moved_plan(self, pos: StagePosition) -> WindowPlan | None:
        """The default plan moved into an epoch too short for it (Notes 7), or ``None``."""
        first = self.plan.first_active()
        length = pos.num_batches if pos.num_batches < math.inf else pos.last_batches
        if self._chosen or pos.short_epochs == 0 or pos.windows_used > 0 or first is None or not 0 < length <= first:
            return None
        batch = min(self._warmup, int(length) - 1)  # warmed up on the batches before it, where it has any
        return BatchListPlan((batch,), warmup=batch)

    def next_batch(self, stage: str, context: Any) -> WindowToSave | None:
        """Moves ``stage`` on to its next batch and sets the window up for it (:meth:`before_batch`). Between
        windows, a comparison or two, and a look at the plan only where its quiet span ends."""
        pos = self.stages[stage]
        pos.batch += 1
        if self.open is None:
            if pos.batch < pos.quiet_until or not self.records or pos.windows_used >= self.max_windows:
                return None  # the plan leaves the batch alone, or no window opens on this rank or for this stage
            if pos.batch < pos.num_batches:
                pos.quiet_until = self._plan(pos).next_action(pos.batch, pos.num_batches)
                if pos.batch < pos.quiet_until:
                    return None
        return self.before_batch(stage, context)

    def before_batch(self, stage: str, context: Any) -> WindowToSave | None:
        """Sets the window up for the stage's current batch, as the plan says: opens, warms up, starts
        recording, or opens the batch's step span; at the end of the epoch, saves a window still open."""
        pos = self.stages[stage]
        open_ = self.open
        if open_ is None and pos.batch < pos.quiet_until:
            return None  # the plan leaves the batch alone; with no window open, none is to close
        if pos.batch >= pos.num_batches:
            # The epoch's last batch is done: a window still open cannot complete.
            return self.close(stage, shortened=True)
        if open_ is None and (not self.records or pos.windows_used >= self.max_windows):
            return None
        action = self._plan(pos).action(pos.batch, pos.num_batches)
        if action is Action.NONE:
            return None
        if open_ is None and action is Action.WARMUP and not self._records_later(pos):
            return None  # a warm-up the epoch ends before any recorded batch: torch warns, and it costs a batch
        if open_ is None:
            open_ = self._open(stage, pos)
            if open_ is None:
                return None
        elif open_.stage != stage:
            self._info(
                f"overlap:{stage}",
                f"PerfCallback: a {stage} window was skipped: it fell inside a {open_.stage} window"
                f" (a validation run in the middle of a training window). Only one profiler can run at a time.",
            )
            return None
        window = open_.window
        if action is Action.WARMUP:
            if window.state is WindowState.CREATED:
                window.warm_up()
            return None
        if window.state in (WindowState.CREATED, WindowState.WARMING_UP):
            window.start()
            self.open = dataclasses.replace(open_, step=self._started(stage, context))
        window.begin_step(pos.batch)
        return None

    def _records_later(self, pos: StagePosition) -> bool:
        """Whether a batch after the current one and before the epoch's end is one the plan records (an epoch of
        unknown length: yes). At most the plan's warm-up is looked through, a few batches."""
        if not math.isfinite(pos.num_batches):
            return True
        for batch in range(pos.batch + 1, int(pos.num_batches)):
            action = self._plan(pos).action(batch, pos.num_batches)
            if action in (Action.RECORD, Action.RECORD_AND_SAVE):
                return True
            if action is not Action.WARMUP:
                return False
        return False

    def batch_started(self, stage: str) -> None:
        """The stage's current batch starts inside the open window (call only while one of ``stage`` is)."""
        assert self.open is not None
        self.open.window.mark_ran(self.stages[stage].batch)

    def end_step(self, stage: str) -> WindowToSave | None:
        """The stage's current batch has ended: closes its step span, and the window after its last batch."""
        open_ = self.open
        if open_ is None or open_.stage != stage or open_.window.state is not WindowState.RECORDING:
            return None
        open_.window.end_step()
        pos = self.stages[stage]
        if self._plan(pos).action(pos.batch, pos.num_batches) is Action.RECORD_AND_SAVE:
            return self.close(stage, shortened=False)
        return None

    def validation_start(self) -> WindowToSave | None:
        """A validation run starts inside training: an open training window that recorded batches pauses;
        one that did not (warming up) is dropped, so that the validation run can have a window."""
        open_ = self.open
        if open_ is None or open_.stage != "train":
            return None
        if open_.window.state is WindowState.RECORDING and open_.window.ran:
            open_.window.pause()
            return None
        return self.close("train", shortened=False)

    def validation_end(self, context: Any) -> WindowToSave | None:
        """The validation run inside training has ended: a paused training window resumes; with none open,
        the training batch to come is planned again (a window dropped at :meth:`validation_start`)."""
        open_ = self.open
        if open_ is None:
            return self.before_batch("train", context)
        if open_.window.state is WindowState.PAUSED:
            open_.window.resume()
        return None

    def close(self, stage: str | None = None, *, shortened: bool) -> WindowToSave | None:
        """Closes the open window (only if it is ``stage``'s, when given). One that recorded nothing is
        stopped here and does not count against ``max_windows``; one that did is returned, still to stop."""
        open_ = self.open
        if open_ is None or stage not in (None, open_.stage):
            return None
        self.open = None
        window, pos = open_.window, self.stages[open_.stage]
        recorded = window.recorded
        if not recorded:
            if window.state is not WindowState.STOPPED:
                window.stop()
            pos.windows_used -= 1
            return None
        if shortened:
            planned = planned_batches(self._plan(pos), recorded[0], recorded[-1])
            stopped_in = recorded[-1] == pos.batch  # the batch's end never came: the run stopped inside it
            shortened = stopped_in or recorded[-1] < planned[1]  # else it recorded all it planned, whole
            if shortened:
                say = self._warn if stopped_in else self._unmet
                say(f"shortened:{open_.stage}", _cut_short(open_.stage, planned, recorded, stopped_in))
        pos.windows_this_epoch += 1
        return WindowToSave(open=open_, shortened=shortened, recorded=recorded)

    def drop(self, stage: str) -> None:
        """Drops ``stage``'s open window after a failure, stopping its profiler if it can."""
        open_ = self.open
        if open_ is None or open_.stage != stage:
            return
        self.open = None
        if open_.window.state not in (WindowState.CREATED, WindowState.STOPPED):
            with contextlib.suppress(Exception):  # the profiler is already broken; nothing more to save
                open_.window.stop()

    def epoch_end(self, stage: str) -> None:
        """The stage's epoch is over and reported: warns (once) when it was too short for the plan to open a
        window, on a process that records windows and a stage with windows left."""
        pos = self.stages[stage]
        if self.verdicts is not None:
            self.verdicts.ended(stage, pos.epoch)
        pos.last_batches = pos.batch
        first = self.plan.first_active()
        if (
            pos.windows_this_epoch == 0
            and first is not None
            and pos.batch <= first
            and pos.windows_used < self.max_windows
            and self.records
        ):
            pos.short_epochs += 1
            moved = (
                "; the stage's next epoch under this callback (a later epoch or Trainer call) records one of its"
                " batches instead (until a window saves)"
                if not self._chosen
                else ". Lower `schedule.skip_first`/`wait`, or pass `batches=[...]`"
            )
            batches = pos.batch  # built only where said: at most once, where this runs at every short epoch
            self._unmet(
                f"short:{stage}",
                lambda: (
                    f"PerfCallback: the {stage} epoch had {batches} batches, too few for the schedule (its first"
                    f" recorded batch is {first}), so it has no profiler window{moved}."
                ),
            )

    def _open(self, stage: str, pos: StagePosition) -> OpenWindow | None:
        if pos.windows_used > 0 and not self._within_budget(stage, pos):
            return None
        window = self._new_window(stage, pos.epoch)
        if window is None:
            return None
        self.open = OpenWindow(window=window, stage=stage, epoch=pos.epoch)
        if self.budget is not None:
            self.budget.opened()
        pos.windows_used += 1
        if pos.windows_used == self.max_windows:
            self._info(
                f"max:{stage}",
                f"PerfCallback: this {stage} window is the last of max_windows={self.max_windows}; no more"
                f" {stage} traces in this run.",
            )
        return self.open

    def _within_budget(self, stage: str, pos: StagePosition) -> bool:
        """Whether the budget lets a later window of ``stage`` open at its current batch; a planned window it
        kept closed at its first batch stays closed at the next ones."""
        if self.budget is None:
            return True
        if self._denied == (stage, pos.epoch, pos.batch - 1) and (
            self._plan(pos).action(pos.batch - 1, pos.num_batches) is not Action.RECORD_AND_SAVE
        ):
            self._denied = (stage, pos.epoch, pos.batch)
            return False
        now = self._clock()
        allowed = self.budget.allows(now)
        if self.verdicts is not None:
            allowed = self.verdicts.agree(stage, pos.epoch, pos.batch, allowed)
        if allowed:
            return True
        self._denied = (stage, pos.epoch, pos.batch)
        self.budget.skipped()
        cost = self.budget.cost(now)
        self._info(
            f"budget:{stage}",
            f"PerfCallback: a planned {stage} window was skipped to keep profiling within"
            f" profile_budget={limit(cost.budget or 0.0)} of the run's time (so far {percent(cost.share or 0.0, 1)},"
            f" {cost.windows} window{'s' if cost.windows != 1 else ''}); later ones open as the run makes room."
            " Pass `profile_budget=None` to open every planned window.",
        )
        return False
