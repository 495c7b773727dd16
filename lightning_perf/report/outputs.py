"""
Outputs
=======

Where our scalars, text and images go.

- Scalars go to every Lightning logger of the run (``logger.log_metrics``: TensorBoard, CSV, W&B, MLflow,
  ...), as Lightning's own ``LearningRateMonitor`` does, on the step axis that logger can keep:

  - a TensorBoard logger keeps a step axis per series: every stage gets its own (the training series at the
    trainer's ``global_step``, the others at their own batch count), so that they never pile onto the
    training steps;
  - every other logger has one step axis for the whole run (a CSV file's ``step`` column; W&B drops what is
    logged at a step lower than its last): our rows go on the axis Lightning logs its own rows at, each with
    its ``epoch`` as Lightning's rows have, one row per call; a series that would pile onto one step of that
    axis (a validation run's batches) is left to TensorBoard and our own event file.

- Text (operator tables, findings) goes to the run's TensorBoard logger, so that one ``tensorboard --logdir``
  shows a run's scalars, tables and traces together.
- The Custom Scalars dashboard's layout (:func:`~lightning_perf.report.metrics.charts_layout`: our charts of
  several series, such as a batch's step time with its data wait and compute) goes, with a Trainer call's
  first per-batch scalars, to an event file of its own in the output directory, which TensorBoard reads as a
  run of its own: TensorBoard merges the layouts of all runs, and a layout the user's code writes to its own
  run is left as it is.
- Without a TensorBoard logger (a ``CSVLogger`` only, or ``logger=False``), all of it also goes to an event
  file of our own in the output directory, on the per-stage axes.

Everything here happens on rank zero only.

A moment's scalars go to a TensorBoard event file as one event holding them all (:func:`one_event`), where
Lightning's ``TensorBoardLogger`` writes an event per scalar: each event is a queue put that wakes the writer's
thread, and 8 scalars took 1.0 ms where one event of 8 took 0.12 ms (2-CPU machine). TensorBoard reads either
alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lightning.pytorch.utilities.rank_zero import rank_zero_only


class Outputs:
    """Writes our scalars, text and images to the run's loggers, or to our own event file.

    Args:
        loggers: The trainer's loggers.
        tensorboards: Those of ``loggers`` that keep a step axis per series (the TensorBoard loggers); the
            first of them also gets our text and images.
        fallback_dir: Where our own event file goes when there is no TensorBoard logger.
        layout: The Custom Scalars layout :meth:`write_layout` writes.
    """

    def __init__(
        self,
        loggers: Sequence[Any],
        *,
        tensorboards: Sequence[Any],
        fallback_dir: str,
        layout: Mapping[str, Any] | None = None,
    ) -> None:
        self._loggers = list(loggers)
        self._layout = layout
        self._tensorboards = list(tensorboards)
        self._single_axis = [lg for lg in loggers if all(lg is not tb for tb in tensorboards)]
        self._tensorboard = self._tensorboards[0] if self._tensorboards else None
        self._fallback_dir = fallback_dir
        self._own: Any = None

    def _writer(self) -> Any:
        if self._tensorboard is not None:
            return self._tensorboard.experiment
        if self._own is None:
            from torch.utils.tensorboard import SummaryWriter

            self._own = SummaryWriter(log_dir=self._fallback_dir)
        return self._own

    @rank_zero_only
    def prepare(self) -> None:
        """Opens the writer now, so that the first write inside a training step does not pay for it."""
        self._writer()

    @rank_zero_only
    def log_scalars(self, metrics: Mapping[str, float], step: int, *, logger_step: int | None, epoch: int) -> None:
        """Logs one moment's scalars: one call per logger, so one row in a logger that writes rows.

        Args:
            metrics: The scalars, by tag.
            step: Their stage's own step axis, for the TensorBoard loggers and our own event file.
            logger_step: Their step on the run's single axis, for every other logger; ``None``: those loggers
                do not get these scalars (they would pile onto one step of that axis).
            epoch: The trainer's current epoch, added to the rows of those loggers as ``epoch``.
        """
        for logger in self._tensorboards:
            if not (_logs_as_lightning(logger) and one_event(logger.experiment, metrics, step)):
                logger.log_metrics(dict(metrics), step=step)
        if logger_step is not None and self._single_axis:
            row = {**metrics, "epoch": epoch}
            for logger in self._single_axis:
                logger.log_metrics(dict(row), step=logger_step)
        if self._tensorboard is None and not one_event(writer := self._writer(), metrics, step):
            for tag, value in metrics.items():
                writer.add_scalar(tag, value, global_step=step)

    @rank_zero_only
    def add_text(self, tag: str, text: str, step: int) -> None:
        self._writer().add_text(tag, text, global_step=step)

    @rank_zero_only
    def add_layout(self, layout: Mapping[str, Any]) -> None:
        """Writes TensorBoard's Custom Scalars layout to our own event file (opened for it where there is a
        TensorBoard logger, and closed again)."""
        if self._tensorboard is None:
            self._writer().add_custom_scalars(dict(layout))
            return
        from torch.utils.tensorboard import SummaryWriter

        with SummaryWriter(log_dir=self._fallback_dir) as writer:
            writer.add_custom_scalars(dict(layout))

    @rank_zero_only
    def write_layout(self) -> None:
        """Writes the layout given at construction (:meth:`add_layout`), the first time only: with the first
        per-batch scalars its charts draw, so that a short Trainer call that logs none (a predict call of a
        few batches) opens no event file for it."""
        if self._layout is not None:
            layout, self._layout = self._layout, None
            self.add_layout(layout)

    @rank_zero_only
    def flush(self) -> None:
        for logger in self._loggers:
            logger.save()
        if self._tensorboard is not None:
            self._tensorboard.experiment.flush()
        elif self._own is not None:
            self._own.flush()

    def __getstate__(self) -> dict[str, Any]:
        # A copy (deep-copied or pickled by a library, with the callback) has no open event file: it opens its
        # own at its first write.
        return {**self.__dict__, "_own": None}

    def close(self) -> None:
        if self._own is not None:
            self._own.close()
            self._own = None


def _logs_as_lightning(logger: Any) -> bool:
    """Whether ``logger`` writes scalars as Lightning's ``TensorBoardLogger`` does, unprefixed: an event per scalar
    under its own tag (its ``log_metrics`` is not overridden by a subclass; no ``prefix``)."""
    from lightning.fabric.loggers import TensorBoardLogger

    return type(logger).log_metrics is TensorBoardLogger.log_metrics and not getattr(logger, "_prefix", "")


def one_event(writer: Any, metrics: Mapping[str, float], step: int) -> bool:
    """Writes ``metrics`` to a ``SummaryWriter``'s event file as one event, each value under its tag as
    ``add_scalar`` writes it; whether it did (``False``: the writer has no open file writer, nothing written)."""
    file_writer = getattr(writer, "file_writer", None)
    if file_writer is None:
        return False
    from torch.utils.tensorboard.summary import Summary  # tensorboard's, as add_scalar makes it

    values = [Summary.Value(tag=tag, simple_value=float(value)) for tag, value in metrics.items()]
    file_writer.add_summary(Summary(value=values), step)
    return True
