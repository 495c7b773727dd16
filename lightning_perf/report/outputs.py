"""
Outputs
=======

Where our scalars, text and images go.

- Scalars go to every Lightning logger of the run (``logger.log_metrics``: TensorBoard, CSV, W&B, ...),
  as Lightning's own ``LearningRateMonitor`` does.
- Text (operator tables) and images (step-time charts) go to the run's
  :class:`~lightning.pytorch.loggers.TensorBoardLogger`, so that one ``tensorboard --logdir`` shows a run's
  scalars, tables and traces together.
- Without a ``TensorBoardLogger`` (a ``CSVLogger`` only, or ``logger=False``), all of it also goes to an
  event file of our own in the output directory.

Everything here happens on rank zero only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning.pytorch.loggers import Logger, TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only


class Outputs:
    """Writes our scalars, text and images to the run's loggers, or to our own event file.

    Args:
        loggers: The trainer's loggers.
        fallback_dir: Where our own event file goes when there is no :class:`TensorBoardLogger`.
    """

    def __init__(self, loggers: list[Logger], fallback_dir: str) -> None:
        self._loggers = list(loggers)
        self._tensorboard = next((lg for lg in loggers if isinstance(lg, TensorBoardLogger)), None)
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
    def log_scalars(self, metrics: Mapping[str, float], step: int) -> None:
        for logger in self._loggers:
            logger.log_metrics(dict(metrics), step=step)
        if self._tensorboard is None:
            writer = self._writer()
            for tag, value in metrics.items():
                writer.add_scalar(tag, value, global_step=step)

    @rank_zero_only
    def add_text(self, tag: str, text: str, step: int) -> None:
        self._writer().add_text(tag, text, global_step=step)

    @rank_zero_only
    def add_image(self, tag: str, image_hwc: Any, step: int) -> None:
        self._writer().add_image(tag, image_hwc, global_step=step, dataformats="HWC")

    @rank_zero_only
    def flush(self) -> None:
        for logger in self._loggers:
            logger.save()
        if self._tensorboard is not None:
            self._tensorboard.experiment.flush()
        elif self._own is not None:
            self._own.flush()

    def close(self) -> None:
        if self._own is not None:
            self._own.close()
            self._own = None
