"""What libraries do to a callback around Lightning, on real (tiny, CPU) Trainer runs: deep-copy it with the
trainer's arguments, pickle it (a model's ``save_model()`` that pickles its trainer arguments,
``Trainer(strategy="ddp_spawn")``), ``torch.save`` it, and make a new ``Trainer`` for every short ``predict``
call (one forecast each)."""

import copy
import io
import os
import pickle

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from lightning_perf import PerfCallback
from models import TinyModel, trainer

WINDOW_2 = {"skip_first": 1, "warmup": 1, "active": 2}  # records batches 2, 3 of each epoch


def _torch_copy(callback):
    buffer = io.BytesIO()
    torch.save(callback, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


COPIES = {
    "deepcopy": copy.deepcopy,
    "pickle": lambda callback: pickle.loads(pickle.dumps(callback)),
    "torch.save": _torch_copy,
}


@pytest.mark.parametrize("how", list(COPIES))
def test_a_used_callback_copies_with_its_results_and_the_copy_runs_again(tmp_path, how):
    perf = PerfCallback(schedule=WINDOW_2, verbose=0)
    model = TinyModel(n=24)
    trainer(tmp_path / "first", [perf], max_epochs=2).fit(model)
    assert len(perf.windows) == 4  # 2 epochs, train and validate

    copied = COPIES[how](perf)

    assert [w.name for w in copied.windows] == [w.name for w in perf.windows]
    assert copied.epochs == perf.epochs and copied.report == perf.report
    t = trainer(tmp_path / "second", [copied], max_epochs=1)  # a library fits the copy it made
    t.fit(model)
    assert len(copied.windows) == 6 and os.path.isfile(copied.page_path)
    assert len(perf.windows) == 4  # the original is left as it was


class PickleEveryEpoch(Callback):
    """Pickles the trainer's callbacks at each training epoch's end, as a library that saves its trainer
    arguments with every checkpoint does."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def on_train_epoch_end(self, trainer, pl_module):
        perf = next(c for c in trainer.callbacks if isinstance(c, PerfCallback))
        self.sizes.append(len(pickle.dumps(perf)))
        copy.deepcopy(perf)


def test_a_callback_pickles_during_a_run_without_its_open_event_file(tmp_path):
    # logger=False: the callback writes an event file of its own, open during the run.
    perf, pickler = PerfCallback(schedule=WINDOW_2, verbose=0), PickleEveryEpoch()
    trainer(tmp_path, [perf, pickler], max_epochs=2, logger=False).fit(TinyModel(n=24))
    assert len(pickler.sizes) == 2
    assert len(perf.windows) == 4  # the run went on: the copies took nothing from it
