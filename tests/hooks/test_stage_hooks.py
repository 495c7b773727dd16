"""Which Lightning hook is which stage event (StageHooks), with a stand-in trainer: the sanity check is no
epoch, a validation run inside a fit is told apart, evaluation stages sum their dataloaders' batches."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from lightning.pytorch.trainer.states import TrainerFn

from lightning_perf.hooks.stage_hooks import StageHooks


class Recorder(StageHooks):
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def _epoch_start(self, stage, trainer, epoch, num_batches):
        self.events.append(("epoch_start", stage, epoch, num_batches))

    def _batch_start(self, stage, trainer, batch, batch_idx):
        self.events.append(("batch_start", stage, batch, batch_idx))

    def _batch_end(self, stage, trainer, outputs):
        self.events.append(("batch_end", stage, outputs))

    def _epoch_end(self, stage, trainer):
        self.events.append(("epoch_end", stage))

    def _validation_start(self, trainer):
        self.events.append(("validation_start",))

    def _validation_end(self, trainer):
        self.events.append(("validation_end",))

    def _sanity_check_start(self, trainer):
        self.events.append(("sanity_check_start",))


def _trainer(sanity_checking=False, fn=TrainerFn.FITTING):
    return SimpleNamespace(
        sanity_checking=sanity_checking,
        state=SimpleNamespace(fn=fn),
        current_epoch=3,
        num_training_batches=8,
        num_val_batches=[2, 3],
        num_test_batches=[4],
        num_predict_batches=[5, 1],
    )


def _validation_run(hooks, trainer):
    hooks.on_validation_start(trainer, None)
    hooks.on_validation_epoch_start(trainer, None)
    hooks.on_validation_batch_start(trainer, None, "b", 0, 1)
    hooks.on_validation_batch_end(trainer, None, "out", "b", 0, 1)
    hooks.on_validation_epoch_end(trainer, None)
    hooks.on_validation_end(trainer, None)


def test_training_hooks_name_the_train_stage():
    hooks, trainer = Recorder(), _trainer()
    hooks.on_train_epoch_start(trainer, None)
    hooks.on_train_batch_start(trainer, None, "b", 5)
    hooks.on_train_batch_end(trainer, None, "out", "b", 5)
    hooks.on_train_epoch_end(trainer, None)
    assert hooks.events == [
        ("epoch_start", "train", 3, 8),
        ("batch_start", "train", "b", 5),
        ("batch_end", "train", "out"),
        ("epoch_end", "train"),
    ]


def test_a_validation_run_inside_a_fit_is_a_validate_epoch_between_its_start_and_end():
    hooks = Recorder()
    _validation_run(hooks, _trainer())
    assert hooks.events == [
        ("validation_start",),
        ("epoch_start", "validate", None, 5),  # the stage's next epoch; both dataloaders' batches
        ("batch_start", "validate", "b", 0),
        ("batch_end", "validate", "out"),
        ("epoch_end", "validate"),
        ("validation_end",),
    ]


def test_the_sanity_check_is_no_epoch():
    hooks = Recorder()
    _validation_run(hooks, _trainer(sanity_checking=True))
    assert hooks.events == [("sanity_check_start",)]


def test_the_validation_run_after_the_sanity_check_is_an_epoch():
    # Whether a run is the sanity check is read once, at its start: the next run reads it again.
    hooks = Recorder()
    _validation_run(hooks, _trainer(sanity_checking=True))
    _validation_run(hooks, _trainer())
    assert hooks.events[0] == ("sanity_check_start",) and hooks.events[1:] == [
        ("validation_start",),
        ("epoch_start", "validate", None, 5),
        ("batch_start", "validate", "b", 0),
        ("batch_end", "validate", "out"),
        ("epoch_end", "validate"),
        ("validation_end",),
    ]


def test_a_validate_call_has_no_validation_end_inside_a_fit():
    hooks = Recorder()
    _validation_run(hooks, _trainer(fn=TrainerFn.VALIDATING))
    assert ("validation_end",) not in hooks.events and ("epoch_end", "validate") in hooks.events


@pytest.mark.parametrize(("stage", "batches"), [("test", 4), ("predict", 6)])
def test_test_and_predict_hooks_name_their_stage(stage, batches):
    hooks, trainer = Recorder(), _trainer()
    getattr(hooks, f"on_{stage}_epoch_start")(trainer, None)
    getattr(hooks, f"on_{stage}_batch_start")(trainer, None, "b", 2, 0)
    getattr(hooks, f"on_{stage}_batch_end")(trainer, None, "out", "b", 2, 0)
    getattr(hooks, f"on_{stage}_epoch_end")(trainer, None)
    assert hooks.events == [
        ("epoch_start", stage, None, batches),
        ("batch_start", stage, "b", 2),
        ("batch_end", stage, "out"),
        ("epoch_end", stage),
    ]
