"""
Stage hooks
===========

Lightning's per-stage hooks as the few events of a stage that :class:`~lightning_perf.PerfCallback` acts on.
Each training, validation, test and predict hook names its stage and passes what the event needs; the
sanity-check validation is no stage epoch, and a validation run inside a fit is told apart. A subclass
implements the events; each hook is one call to it, nothing more (the batch hooks run on every batch).

Notes:
    1. Lightning dispatches every hook of every callback on every batch, about a dozen Python calls each (a
       profiler context, its generator, ``state_key``: ``lightning.pytorch.trainer.call._call_callback_hooks``),
       and skips a hook that is not callable (``if callable(fn)``, since Lightning 2.0). So a hook with nothing to
       do is ``None`` on the instance, and a mark hook is the mark itself, bound to its name (one call, no hook
       frame between): :meth:`StageHooks._bind_marks`, and the subclass's ``on_before_optimizer_step``
       (:meth:`~lightning_perf.hooks.stage_events.StageEvents._dispatch_step_hook`). A subclass's own override of
       such a hook is left as it is (the class's hook is what ``super()`` reaches).
"""

from __future__ import annotations

import functools
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from typing_extensions import override

from lightning_perf.collect.phases import AFTER_BACKWARD, BACKWARD, ZERO_GRAD, PhaseMarks

# Lightning's hooks that mark a training batch's phases, and their marks.
_MARK_HOOKS = (
    ("on_before_zero_grad", ZERO_GRAD),
    ("on_before_backward", BACKWARD),
    ("on_after_backward", AFTER_BACKWARD),
)


class StageHooks(Callback):
    """Lightning's per-stage hooks, as stage events for a subclass to implement.

    Events (``stage`` is ``"train"``, ``"validate"``, ``"test"`` or ``"predict"``):

    - :meth:`_epoch_start`: a stage epoch starts: a training epoch, one validation run (several per training
      epoch with ``val_check_interval``), a test or predict run;
    - :meth:`_batch_start` and :meth:`_batch_end`: around each batch (several dataloaders of a stage count as
      one sequence of batches: their sizes are summed);
    - :meth:`_epoch_end`: the stage epoch ends;
    - :meth:`_validation_start` and :meth:`_validation_end`: around a validation run inside a fit;
    - :meth:`_sanity_check_start`: the sanity-check validation starts (none of the above happen in it).

    And the training batches' phase marks (:mod:`lightning_perf.collect.phases`) where ``zero_grad`` and the
    backward's start and end are reached, straight into the subclass's :attr:`_phase_marks` (three times a batch: no
    event between; Notes 1). The optimizer step's mark, where one is needed, is the subclass's
    ``on_before_optimizer_step``, dispatched only where it has one to make or a FLOP count to end.

    Attributes:
        _phase_marks: The training batches' marks; ``None`` where training is not measured.
    """

    # Whether the validation run under way is the sanity check: read once per run, at its start. The Trainer's
    # `sanity_checking` is a property with an enum comparison (about 3 us a read), and the validation hooks
    # asked it six times per run, at every short epoch of a run of them.
    _in_sanity_check = False
    _phase_marks: PhaseMarks | None = None

    def _epoch_start(self, stage: str, trainer: pl.Trainer, epoch: int | None, num_batches: float) -> None:
        """A stage epoch of ``num_batches`` starts: epoch ``epoch``, or (``None``) the stage's next."""
        raise NotImplementedError

    def _batch_start(self, stage: str, trainer: pl.Trainer, batch: Any, batch_idx: int) -> None:
        """Batch ``batch_idx`` starts (training: of the epoch; other stages: of its dataloader)."""
        raise NotImplementedError

    def _batch_end(self, stage: str, trainer: pl.Trainer, outputs: Any) -> None:
        """The batch has ended; ``outputs`` is what its ``*_step`` returned."""
        raise NotImplementedError

    def _epoch_end(self, stage: str, trainer: pl.Trainer) -> None:
        """The stage epoch has ended."""
        raise NotImplementedError

    def _validation_start(self, trainer: pl.Trainer) -> None:
        """A validation run starts (not the sanity check); inside a fit, in the middle of a training epoch."""
        raise NotImplementedError

    def _validation_end(self, trainer: pl.Trainer) -> None:
        """A validation run inside a fit has ended (not the sanity check): the training epoch goes on."""
        raise NotImplementedError

    def _sanity_check_start(self, trainer: pl.Trainer) -> None:
        """The sanity-check validation starts: what Lightning's loops did before it belongs to no epoch."""
        raise NotImplementedError

    def _bind_marks(self, marks: PhaseMarks | None) -> None:
        """The three mark hooks as Lightning calls them (Notes 1): each ``marks.mark`` bound to its name, or, with
        no ``marks`` (training not measured), ``None``: not dispatched at all."""
        for hook, name in _MARK_HOOKS:
            if getattr(type(self), hook) is getattr(StageHooks, hook):
                setattr(self, hook, None if marks is None else functools.partial(marks.mark, name))

    # The instance's own, bound by _bind_marks, are what Lightning calls; these serve a subclass's super().
    @override
    def on_before_zero_grad(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        if (marks := self._phase_marks) is not None:
            marks.mark(ZERO_GRAD)

    @override
    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Any) -> None:
        if (marks := self._phase_marks) is not None:
            marks.mark(BACKWARD)

    @override
    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if (marks := self._phase_marks) is not None:
            marks.mark(AFTER_BACKWARD)

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_start("train", trainer, trainer.current_epoch, trainer.num_training_batches)

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._batch_start("train", trainer, batch, batch_idx)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._batch_end("train", trainer, outputs)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_end("train", trainer)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._in_sanity_check = trainer.sanity_checking
        if not self._in_sanity_check:
            self._validation_start(trainer)

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._in_sanity_check and trainer.state.fn == TrainerFn.FITTING:
            self._validation_end(trainer)

    @override
    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._in_sanity_check:
            self._sanity_check_start(trainer)
        else:
            self._epoch_start("validate", trainer, None, sum(trainer.num_val_batches))

    @override
    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if not self._in_sanity_check:
            self._batch_start("validate", trainer, batch, batch_idx)

    @override
    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if not self._in_sanity_check:
            self._batch_end("validate", trainer, outputs)

    @override
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._in_sanity_check:
            self._epoch_end("validate", trainer)

    @override
    def on_test_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_start("test", trainer, None, sum(trainer.num_test_batches))

    @override
    def on_test_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._batch_start("test", trainer, batch, batch_idx)

    @override
    def on_test_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._batch_end("test", trainer, outputs)

    @override
    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_end("test", trainer)

    @override
    def on_predict_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_start("predict", trainer, None, sum(trainer.num_predict_batches))

    @override
    def on_predict_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._batch_start("predict", trainer, batch, batch_idx)

    @override
    def on_predict_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._batch_end("predict", trainer, outputs)

    @override
    def on_predict_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_end("predict", trainer)
