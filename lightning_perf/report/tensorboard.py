"""
TensorBoard
===========

Where our TensorBoard output goes: the run's own :class:`~lightning.pytorch.loggers.TensorBoardLogger`
when it has one (so scalars, text and traces of a run sit together under one ``tensorboard --logdir``),
else an event file of our own in the output directory.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.loggers import Logger, TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only


class TensorBoardText:
    """Writes markdown text to TensorBoard, on rank zero only.

    Args:
        loggers: The trainer's loggers; the first :class:`TensorBoardLogger` among them is used.
        fallback_dir: Where to write an event file of our own when there is none.
    """

    def __init__(self, loggers: list[Logger], fallback_dir: str) -> None:
        self._logger = next((lg for lg in loggers if isinstance(lg, TensorBoardLogger)), None)
        self._fallback_dir = fallback_dir
        self._own: Any = None

    @property
    def log_dir(self) -> str:
        """The directory whose event files hold our text."""
        return self._logger.log_dir if self._logger is not None else self._fallback_dir

    def _writer(self) -> Any:
        if self._logger is not None:
            return self._logger.experiment
        if self._own is None:
            from torch.utils.tensorboard import SummaryWriter

            self._own = SummaryWriter(log_dir=self._fallback_dir)
        return self._own

    @rank_zero_only
    def prepare(self) -> None:
        """Opens the writer now, so that the first :meth:`add_text` does not pay for it."""
        self._writer()

    @rank_zero_only
    def add_text(self, tag: str, text: str, step: int) -> None:
        self._writer().add_text(tag, text, global_step=step)

    @rank_zero_only
    def flush(self) -> None:
        if self._logger is not None:
            self._logger.experiment.flush()
        elif self._own is not None:
            self._own.flush()

    def close(self) -> None:
        if self._own is not None:
            self._own.close()
            self._own = None
