"""
Stage measures
==============

One stage's always-on measurement between its epoch ends (its clocks, CPU use, recent history, and the pacing of
what it writes), the step axes its scalars are written at, the console line's way out, and each epoch's review:
what its diagnosis reads, kept while the pace leaves its findings pending. What
:class:`~lightning_perf.hooks.epoch_report.EpochReporter` keeps per stage and
:class:`~lightning_perf.PerfCallback`'s per-batch hooks touch.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import lightning.pytorch as pl
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from lightning_perf.collect.cpu import EpochCpu
from lightning_perf.collect.memory import host_rss
from lightning_perf.collect.steps import StepClock
from lightning_perf.config import STAGES
from lightning_perf.diagnose.rules_step import epoch_time
from lightning_perf.hooks.log_pace import (
    LOG_BURST,
    LOG_SHARE,
    MEASURE_BURST,
    MEASURE_SHARE,
    REPORT_BURST,
    REPORT_SHARE,
    LogPace,
)
from lightning_perf.records import EpochSummary, RankSummary
from lightning_perf.report.metrics import batch_metrics
from lightning_perf.report.outputs import Outputs

# The earlier epochs of a stage the rules see (memory_growth reads a trailing run of epochs; its count
# saturates here), and so what a checkpoint keeps of them.
HISTORY_EPOCHS = 32
# The longest a group of short epochs measured together may last (epoch_report, Notes 2), from its first epoch's end:
# the scalars and the report get a point at least this often. Without it, a run whose windows' epochs (each measured
# alone) overspent the measurement pace carried every epoch for seconds while the pace caught up: one group of 442
# epochs (a 600-epoch run with 40 windows). A group's measurement with its findings took 3-3.6 ms in a fit of 10-ms
# epochs (2-CPU machine, benchmarks/epoch_blocks.py): at 1 s, training's and validation's groups cost 0.7% of the
# run, over the measurement pace's share (MEASURE_SHARE, 0.3%), which this bound is not to override; at 3 s, 0.24%
# at most. Our judgment.
GROUP_SECONDS = 3.0


def stage_step(stage: str, trainer: pl.Trainer, total_batches: int) -> int:
    """The stage's step axis: the trainer's global step for training, the stage's own batch count else."""
    return trainer.global_step if stage == "train" else total_batches


def logger_step(stage: str, trainer: pl.Trainer, *, epoch_end: bool) -> int | None:
    """The run's one step axis, for the loggers that have no other (CSV, W&B, MLflow, ...): the step
    Lightning logs its own rows at, so that the axis stays monotonic with ours among them. ``None`` for a
    validation, test or predict batch: the whole of such a run sits at one step of that axis.

    Lightning logs its rows (and ``LearningRateMonitor`` and ``DeviceStatsMonitor`` theirs) at its count of
    batches that stepped the optimizer, a private counter read here with ``global_step`` as the fallback:
    the same number in automatic optimization, but ``on_train_batch_end`` sees ``global_step`` already past
    the batch whose row Lightning writes next, and a manual-optimization module's optimizers each count.
    """
    if stage != "train" and not epoch_end:
        return None
    step = getattr(getattr(trainer.fit_loop, "epoch_loop", None), "_batches_that_stepped", trainer.global_step)
    # Lightning logs a training epoch's end at its last batch's step: its count has moved past that batch.
    return max(step - 1, 0) if stage == "train" and epoch_end else step


class EpochReview(NamedTuple):
    """A stage epoch's findings still to report (:mod:`~lightning_perf.hooks.epoch_report`, Notes 1): its summary
    and what its diagnosis reads that later epochs change; ``order``: where it ended among the run's stage
    epochs."""

    summary: EpochSummary
    ranks: tuple[RankSummary, ...]
    history: tuple[EpochSummary, ...]
    validation: tuple[EpochSummary, ...]
    fit_seconds: tuple[float, float] | None
    order: int


class Reviews:
    """Builds each stage epoch's :class:`EpochReview`, and keeps what a training epoch's diagnosis reads of the
    epochs before it: the validation runs inside it and the fits' step time so far (on rank zero)."""

    def __init__(self) -> None:
        self._validation: list[EpochSummary] = []  # the validation runs inside the current training epoch
        self._fit_seconds = (0.0, 0.0)  # training and validation step time over the fits so far

    def review(
        self,
        summary: EpochSummary,
        ranks: tuple[RankSummary, ...],
        history: Iterable[EpochSummary],
        order: int,
        trainer: pl.Trainer,
    ) -> EpochReview:
        """The epoch's review: its stage's ``history`` before it, ``order`` among the run's stage epochs; the fits'
        bookkeeping is kept on rank zero, where the diagnosis runs."""
        fitting, keep = trainer.state.fn == TrainerFn.FITTING, trainer.is_global_zero
        validation: tuple[EpochSummary, ...] = ()
        fit_seconds = None
        if keep and summary.stage == "validate" and fitting:
            self._validation.append(summary)
        elif keep and summary.stage == "train":
            validation, self._validation = tuple(self._validation), []
            train_s, val_s = self._fit_seconds
            fit_seconds = self._fit_seconds = (
                train_s + epoch_time(summary),
                val_s + sum(epoch_time(v) for v in validation),
            )
        return EpochReview(summary, ranks, tuple(history), validation, fit_seconds, order)


@dataclass
class StageMeasure:
    """One stage's always-on measurement: its clocks, its batches over the run, its epoch's peaks and CPU
    use, and its recent epochs; and the pacing of its per-batch scalars, of its epochs' measurement and of their
    findings."""

    clock: StepClock
    #: Whether its per-batch scalars are written now; all stages share one (:func:`stage_measures`).
    pace: LogPace
    #: Whether an epoch is measured on its own now (:mod:`~lightning_perf.hooks.epoch_report`, Notes 2); all
    #: stages share one.
    measure_pace: LogPace
    total_batches: int = 0  # over the whole run: the stage's own TensorBoard step axis
    host_rss_peak: int | None = None
    cpu: EpochCpu = dataclasses.field(default_factory=EpochCpu)  # the epoch's wall time, workers' CPU, CPU waits
    in_epoch: bool = False  # between its epoch start and end: what an interruption leaves to summarize
    history: deque[EpochSummary] = dataclasses.field(default_factory=lambda: deque(maxlen=HISTORY_EPOCHS))
    records: int = 0  # the epochs (or groups) that joined the history over the run: the stage's entries in the report
    #: Whether an epoch's findings are reported now (:mod:`~lightning_perf.hooks.epoch_report`, Notes 1).
    report_pace: LogPace = dataclasses.field(default_factory=lambda: LogPace(share=REPORT_SHARE, burst=REPORT_BURST))
    pending: EpochReview | None = None  # the latest epoch's findings, where the pace has not reported them yet
    carried: bool = False  # the epochs that ended since the last measured one wait to be measured with the next
    group_start: float = 0.0  # when the first of those ended

    def carry(self, now: float, *, windowed: bool, alone: bool) -> bool:
        """Whether the epoch that just ended (``now``, in seconds) is carried into the next one, to be measured
        with it (:mod:`~lightning_perf.hooks.epoch_report`, Notes 2): where the measurement pace is spent, in a
        process ``alone`` (no cross-rank gather to join), an epoch not ``windowed`` (no window recorded in it,
        none processed at its end), in a group younger than :data:`GROUP_SECONDS`."""
        if not self.carried:
            self.group_start = now
        young = now - self.group_start < GROUP_SECONDS
        self.carried = alone and not windowed and young and not self.measure_pace.due()
        return self.carried

    def log_batch(self, stage: str, trainer: pl.Trainer, outputs: Outputs | None) -> None:
        """Logs the latest batch's scalars to ``outputs`` and samples the host memory, where the stage's pace
        allows it (:mod:`~lightning_perf.hooks.log_pace`)."""
        if not self.pace.due():
            return
        self.pace.start()
        loss = self.clock.last_loss
        metrics = batch_metrics(
            stage,
            data_wait=self.clock.data_wait[-1],
            compute=self.clock.compute[-1],
            batch_size=self.clock.batch_sizes[-1],
            loss=None if loss is None else float(loss),  # the one device sync, at the logging cadence only
        )
        if outputs is not None:
            outputs.write_layout()  # the first time: the charts of these scalars
            outputs.log_scalars(
                metrics,
                stage_step(stage, trainer, self.total_batches),
                logger_step=logger_step(stage, trainer, epoch_end=False),
                epoch=trainer.current_epoch,
            )
        rss = host_rss()
        if rss is not None:
            self.host_rss_peak = max(rss, self.host_rss_peak or 0)
        self.pace.end()


def stage_measures(batch_size: Callable[[Any], int | None], *, log_loss: bool) -> dict[str, StageMeasure]:
    """Every stage's measure (``batch_size``: what counts a batch's samples; ``log_loss``: keep the losses, but
    predict's). The stages share one pace for their per-batch scalars and one for their epochs' measurement
    (:mod:`~lightning_perf.hooks.log_pace` Notes 3, :mod:`~lightning_perf.hooks.epoch_report` Notes 2)."""
    pace = LogPace(share=LOG_SHARE, burst=LOG_BURST)
    measure_pace = LogPace(share=MEASURE_SHARE, burst=MEASURE_BURST)
    return {
        stage: StageMeasure(StepClock(batch_size, keep_loss=log_loss and stage != "predict"), pace, measure_pace)
        for stage in STAGES
    }


# TQDMProgressBar's bars, by the attributes its `print` looks through (Lightning 2.x).
_TQDM_BARS = ("_train_progress_bar", "_val_progress_bar", "_test_progress_bar", "_predict_progress_bar")


def say(trainer: pl.Trainer, message: str) -> None:
    """``message`` on the console: through the Trainer's progress bar where one is open (`ProgressBar.print`: TQDM
    writes it above the bar, where a log line would be glued to the bar's last line), else Lightning's log.

    TQDM's ``print`` writes through an open bar and drops the message where none is: at a Trainer call's end
    (teardown comes after each loop closed its bar), the lines held back for it were lost."""
    bar = trainer.progress_bar_callback
    if bar is not None and getattr(bar, "is_enabled", False) and _prints(bar):
        bar.print(message)
    else:
        rank_zero_info(message)


def _prints(bar: object) -> bool:
    """Whether ``bar.print`` writes: a TQDM bar (by its bars' attributes) only with one of them open."""
    bars = [getattr(bar, name) for name in _TQDM_BARS if hasattr(bar, name)]
    return not bars or any(tqdm is not None and not tqdm.disable for tqdm in bars)
