"""
Stage events
============

The stage events of :class:`~lightning_perf.hooks.stage_hooks.StageHooks` wired to the units that measure them:
each stage epoch's and batch's clocks, the profiler windows opened and saved at their batches, the FLOP count's
batch, and each epoch measured and reported at its end (or carried into the next). The batch hooks run on every
batch and the epoch hooks at every epoch of a run of thousands of short ones: what they do between windows is
kept to clock reads, appends and comparisons (docs/cost.md).

:class:`~lightning_perf.PerfCallback` makes the units and inherits these events; its own part is construction,
setup, the end of a Trainer call and the checkpoint state.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from typing_extensions import override

from lightning_perf.collect.loops import LoopStartTimer
from lightning_perf.collect.phases import OPTIMIZER
from lightning_perf.diagnosis_context import window_summaries
from lightning_perf.hooks.epoch_report import EpochReporter
from lightning_perf.hooks.error_policy import ErrorPolicy
from lightning_perf.hooks.flop_count import FlopCounting, after_window
from lightning_perf.hooks.live_status import LiveStatus
from lightning_perf.hooks.profiler_windows import ProfilerWindows
from lightning_perf.hooks.rank_staging import RankStaging
from lightning_perf.hooks.stage_hooks import StageHooks
from lightning_perf.hooks.stage_measure import StageMeasure
from lightning_perf.hooks.window_control import StagePosition, WindowControl
from lightning_perf.records import EpochSummary


class StageEvents(StageHooks):
    """The stage events, implemented over the units a subclass makes (:class:`~lightning_perf.PerfCallback`).

    Attributes:
        _policy: What a failure of our own does.
        _epochs: Each stage epoch measured, diagnosed and reported.
        _staging: The ranks' exchange at each epoch's end, and the traces published.
        _profiler_windows: The real windows, made and saved.
        _control: Which batches to record, and the one open window.
        _stages: The measured stages' clocks and counts, by stage (a stage not measured is absent).
        _positions: Each stage's position (``_control.stages``).
        _flops: The FLOP count.
        _loop_timer: What Lightning's loops spend starting DataLoaders before our hooks.
        _live: The progress bar's status item.
    """

    _policy: ErrorPolicy
    _epochs: EpochReporter
    _staging: RankStaging
    _profiler_windows: ProfilerWindows
    _control: WindowControl
    _stages: dict[str, StageMeasure]
    _positions: dict[str, StagePosition]
    _flops: FlopCounting
    _loop_timer: LoopStartTimer
    _live: LiveStatus

    @override
    def _epoch_start(
        self, stage: str, trainer: pl.Trainer, epoch: int | None, num_batches: float, first_batch: int = 0
    ) -> None:
        st = self._stages.get(stage)
        if st is None:
            return
        # At every epoch of a run of short epochs: inline try blocks (see _batch_end); a quiet epoch's window calls
        # return at once (WindowControl, Notes 8), a carried one's start reads nothing (EpochReporter.start_epoch).
        try:
            self._staging.publish()  # those whose gather every rank has joined since; no blocking
        except Exception as err:
            self._policy.fail(None, err)
        control = self._control
        records = control.epoch_start(stage, num_batches, epoch=epoch, first_batch=first_batch)
        st.in_epoch = True
        if stage == "train":
            self._flops.epoch_start(window_ahead=records)
        waited = self._loop_timer.take(stage)
        self._policy.safely(stage, self._epochs.start_epoch, stage, trainer, waited, self._staging.node_ranks)
        if self._profiler_windows.busy:  # a window of another stage is still processed: no contention of the run's
            st.cpu.pause()
        try:
            self._profiler_windows.save(control.before_batch(stage, trainer))
        except Exception as err:
            self._policy.fail(stage, err)
        st.clock.epoch_start(waited, carried=st.carried)

    @override
    def _batch_start(self, stage: str, trainer: pl.Trainer, batch: Any, batch_idx: int) -> None:
        st = self._stages.get(stage)
        if st is None:  # a stage not measured
            return
        if stage == "train" and batch_idx != self._positions["train"].batch:
            # Resumed from a mid-epoch checkpoint: Lightning continues the epoch without on_train_epoch_start.
            self._epoch_start("train", trainer, trainer.current_epoch, trainer.num_training_batches, batch_idx)
        window = self._control.open
        if window is not None and window.stage == stage:
            st.clock.batch_start(batch, profiled=True)
            self._control.batch_started(stage)
        elif stage == "train" and batch_idx >= self._flops.offer_from:  # counted: left out of the times too
            st.clock.batch_start(batch, profiled=self._epochs.flops_batch_start(batch, batch_idx))
            self._dispatch_step_hook()  # a count under way ends at the optimizer step
        else:
            st.clock.batch_start(batch)

    @override
    def _batch_end(self, stage: str, trainer: pl.Trainer, outputs: Any) -> None:
        st = self._stages.get(stage)
        if st is None:
            return
        st.clock.batch_end(outputs)
        if self._epochs.batch_due:  # a FLOP count to keep, the model's memory to count
            self._epochs.batch_ended(stage, trainer)
            self._dispatch_step_hook()
        st.total_batches += 1
        # Inline try blocks, not policy.safely(): free in CPython 3.11 when nothing raises, and no bound-method or
        # argument-tuple allocation on every batch.
        control = self._control
        closed = False
        if control.open is not None:  # the batch's step span ends first: what we do next is no part of the step
            try:
                closed = self._profiler_windows.save(control.end_step(stage))
            except Exception as err:
                self._policy.fail(stage, err)
        # 0 (e.g. Trainer(barebones=True)): no per-batch scalars. (Set by a connector of Lightning's: unseen by mypy.)
        cadence = trainer.log_every_n_steps  # type: ignore[attr-defined]
        if cadence and st.total_batches % cadence == 0:
            try:
                st.log_batch(stage, trainer, self._epochs.outputs)
                self._live.update(stage, st.clock, cadence)
            except Exception as err:
                self._policy.fail(stage, err)
        try:
            if (to_save := control.next_batch(stage, trainer)) is not None:
                closed = self._profiler_windows.save(to_save) or closed
        except Exception as err:
            self._policy.fail(stage, err)
        if closed and stage == "train":  # the FLOP count may take the next batch (flop_count, Notes 2)
            self._policy.safely(stage, self._flops_after_window, trainer)
        if not st.cpu.paused:  # between windows: the next batch's data wait starts now
            st.clock.restart(after_close=closed)
            return
        # What we did after the batch (logging, closing a window) is no part of the next batch's data wait; the
        # batch after a close is left out of the epoch's times (StepClock.after_close), and its CPU waits too, as
        # are those while the window is still processed (its process takes a CPU: no contention of the run's).
        processing = control.open is None and self._profiler_windows.busy
        st.clock.restart(after_close=closed or processing)
        if not closed and control.open is None and not processing:
            st.cpu.resume()

    @override
    def _epoch_end(self, stage: str, trainer: pl.Trainer) -> None:
        st = self._stages.get(stage)
        if st is None:
            return
        try:
            if self._profiler_windows.save(self._control.close(stage, shortened=True)) and stage == "train":
                self._flops_after_window(trainer)  # a window the epoch cut short
        except Exception as err:
            self._policy.fail(stage, err)
        waited = self._profiler_windows.join()  # the epoch's windows are written and in _epochs.windows before reading
        st.in_epoch = False
        if self._epochs.carry(stage, self._positions[stage], waited, alone=not self._staging.exchanging):
            self._control.epoch_end(stage)  # measured with the next epoch (epoch_report, Notes 2)
            return
        summary: EpochSummary | None = None
        try:
            summary = self._epochs.measure(stage, self._positions[stage].epoch, waited=waited)
        except Exception as err:
            self._policy.fail(stage, err)
        windows = window_summaries(self._epochs.windows, stage, summary.epoch) if summary else ()
        ranks = self._staging.gather(stage, summary, windows, global_zero=trainer.is_global_zero)  # on every rank
        self._policy.safely(stage, self._staging.publish)
        if summary is not None:
            self._policy.safely(stage, self._epochs.report_epoch, summary, trainer, ranks)
            self._live.diagnosed(stage, self._epochs.findings_by_epoch.get((stage, summary.epoch)))
        self._control.epoch_end(stage)

    def _flops_after_window(self, trainer: pl.Trainer) -> None:
        """A training window closed: the FLOP count may take the next batch (flop_count, Notes 2)."""
        after_window(
            self._flops, self._epochs.budget, self._stages["train"].clock, trainer, self._positions["train"].batch
        )

    @override
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        # The batch's phase mark, where an optimizer's step marks no end of its own (phases, Notes 3).
        if (marks := self._phase_marks) is not None and not marks.step_ends:
            marks.mark(OPTIMIZER)
        if self._flops.active and pl_module.automatic_optimization:  # the count ends with the backward (flops Notes 3)
            self._flops.finish(pl_module, self._epochs.run_info, self._policy)
            self._dispatch_step_hook()

    def _dispatch_step_hook(self) -> None:
        """Whether Lightning calls :meth:`on_before_optimizer_step` (stage_hooks, Notes 1): only where it has a mark
        to make (an optimizer without the step's post-hook) or a FLOP count to end; call where either changes."""
        marks = self._phase_marks
        if self._flops.active or (marks is not None and not marks.step_ends):
            self.__dict__.pop("on_before_optimizer_step", None)
        elif type(self).on_before_optimizer_step is StageEvents.on_before_optimizer_step:  # not a subclass's own
            self.on_before_optimizer_step = None  # type: ignore[method-assign,assignment]

    @override
    def _validation_start(self, trainer: pl.Trainer) -> None:
        # A validation run inside a training window must not land in its trace (WindowControl.validation_start).
        try:
            self._profiler_windows.save(self._control.validation_start())
        except Exception as err:
            self._policy.fail("train", err)

    @override
    def _validation_end(self, trainer: pl.Trainer) -> None:
        st = self._stages.get("train")
        if st is None:
            return
        st.clock.restart()  # the validation run is no training batch's data wait
        try:
            self._profiler_windows.save(self._control.validation_end(trainer))
        except Exception as err:
            self._policy.fail("train", err)

    @override
    def _sanity_check_start(self, trainer: pl.Trainer) -> None:
        self._loop_timer.take("validate")  # the sanity check's DataLoader start-up is no epoch's
