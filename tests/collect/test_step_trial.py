"""The step trials at the collect level, on real Trainers: one real batch and a copy of the LightningModule, the
advised autocast dtype or thread count timed against the run's own, and the training left exactly as it was."""

from __future__ import annotations

import random

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from lightning_perf.collect.memory import NestedPeaks
from lightning_perf.collect.precision_trial import try_precision
from lightning_perf.collect.run_info import first_dataloader
from lightning_perf.collect.thread_trial import try_threads
from models import TinyModel, torch_threads, trainer

BF16 = dict(rule="precision", written='precision="bf16-mixed"', epoch=0)
TWO = dict(rule="cpu_threads", written="torch.set_num_threads(2)", epoch=0)


class Logged(TinyModel):
    """TinyModel with dropout, a logged loss, a dict returned, and a count of its steps."""

    def __init__(self) -> None:
        super().__init__(n=32, batch_size=8, width=64)
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.5), nn.Linear(64, 1))
        self.steps = 0
        self.fail_at: int | None = None  # a thread count its step raises at

    def training_step(self, batch, batch_idx):
        if self.fail_at == torch.get_num_threads():
            raise ValueError("broken step")
        self.steps += 1
        loss = super().training_step(batch, batch_idx)
        self.log("loss", loss)
        return {"loss": loss}

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class Trial(pl.Callback):
    """Runs ``trial(trainer, loader)`` at the first training epoch's end; keeps what it returns or raises, and the
    training's state just before and after it."""

    def __init__(self, trial) -> None:
        self.trial = trial
        self.result = None
        self.before = self.after = None

    def state(self, trainer, module):
        optimizer = trainer.optimizers[0]
        tensors = [p.detach().clone() for p in module.parameters()]
        tensors += [p.grad.clone() for p in module.parameters() if p.grad is not None]
        tensors += [v.clone() for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        metrics = {k: v.clone() for k, v in trainer.callback_metrics.items()}
        rng = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())  # noqa: NPY002 (the global stream a trial must keep)
        return tensors, metrics, rng, torch.get_num_threads(), module.steps

    def on_train_epoch_end(self, trainer, pl_module):
        if self.result is not None:
            return
        self.before = self.state(trainer, pl_module)
        try:
            self.result = self.trial(trainer, first_dataloader(trainer.train_dataloader))
        except Exception as err:
            self.result = err
        pl_module.fail_at = None
        self.after = self.state(trainer, pl_module)


def run(tmp_path, trial, model=None):
    """A fit on one torch thread (a trial of 2 then changes the count), ``trial`` at its epoch's end."""
    callback = Trial(trial)
    with torch_threads(1):
        trainer(tmp_path, [callback], max_epochs=1, limit_val_batches=0, logger=False).fit(model or Logged())
    return callback


def same(before, after) -> bool:
    tensors_a, metrics_a, rng_a, threads_a, steps_a = before
    tensors_b, metrics_b, rng_b, threads_b, steps_b = after
    return (
        all(torch.equal(a, b) for a, b in zip(tensors_a, tensors_b, strict=True))
        and metrics_a.keys() == metrics_b.keys()
        and all(torch.equal(metrics_a[k], metrics_b[k]) for k in metrics_a)
        and torch.equal(rng_a[0], rng_b[0])
        and rng_a[1] == rng_b[1]
        and np.array_equal(rng_a[2], rng_b[2])
        and threads_a == threads_b
        and steps_a == steps_b
    )


def test_bf16_autocast_is_timed_on_a_copy_with_a_real_batch_and_the_training_is_left_as_it_was(tmp_path):
    callback = run(tmp_path, lambda trainer, loader: try_precision(trainer, loader, "bfloat16", **BF16))
    record = callback.result
    assert record.untried is None and record.current > 0 and record.advised > 0 and record.ratio > 0, record
    assert record.batches == 9 and record.repetitions == 3 and record.seconds > 0, record
    assert record.current_peak is None and record.advised_peak is None  # not measured on a CPU
    # Parameters, gradients, Adam's state, the logged metrics (the copy's self.log reaches no trainer), every
    # random stream (the copy's dropout), the thread count and the module's own attributes: as before the trial.
    assert same(callback.before, callback.after)


def test_an_advised_thread_count_is_timed_and_the_count_is_put_back(tmp_path):
    callback = run(tmp_path, lambda trainer, loader: try_threads(trainer, loader, 2, **TWO))
    record = callback.result
    assert record.untried is None and record.current > 0 and record.advised > 0, record
    assert same(callback.before, callback.after) and callback.after[3] == 1


def test_a_trial_past_its_limit_stops_after_one_repetition(tmp_path):
    callback = run(tmp_path, lambda trainer, loader: try_threads(trainer, loader, 2, limit=0.0, **TWO))
    assert callback.result.repetitions == 1 and callback.result.batches == 3, callback.result


def test_a_step_that_raises_at_the_advised_count_puts_the_thread_count_back(tmp_path):
    def broken(trainer, loader):
        trainer.lightning_module.fail_at = 2  # the copy inherits it; the training steps on 1 thread
        return try_threads(trainer, loader, 2, **TWO)

    callback = run(tmp_path, broken)
    assert isinstance(callback.result, ValueError)
    assert callback.before[3] == callback.after[3] == 1


class Manual(Logged):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        loss = super().training_step(batch, batch_idx)["loss"]
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()


class Stream(IterableDataset):
    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        for _ in range(16):
            x = torch.randn(16, generator=g)
            yield x, (x.sum(0, keepdim=True) > 0).float()


class Streamed(Logged):
    def train_dataloader(self):
        return DataLoader(Stream(), batch_size=8)


class ReadsTrainer(Logged):
    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx)["loss"] * (1 + 0 * self.trainer.global_step)


class NoLoss(Logged):
    """Skips its first batch (returns ``None``), which is the batch index a trial's step passes."""

    def training_step(self, batch, batch_idx):
        return None if batch_idx == 0 else super().training_step(batch, batch_idx)


class ReadsIterator(Logged):
    def training_step(self, dataloader_iter):
        batch, batch_idx, _ = next(dataloader_iter)
        return TinyModel.training_step(self, batch, batch_idx)


@pytest.mark.filterwarnings("ignore:`training_step` returned `None`")
@pytest.mark.parametrize(
    ("model", "why"),
    [
        (Manual, "optimizes manually (`automatic_optimization=False`)"),
        (Streamed, "an `IterableDataset` is read as a stream"),
        (ReadsTrainer, "`training_step` needs the trainer (`self.trainer`)"),
        (NoLoss, "`training_step` returned no loss to step (NoneType)"),
        (ReadsIterator, "`training_step` reads the DataLoader's iterator itself (`dataloader_iter`)"),
    ],
    ids=["manual", "iterable", "trainer", "no-loss", "dataloader-iter"],
)
def test_what_cannot_be_tried_says_why_and_leaves_the_training_as_it_was(tmp_path, model, why):
    callback = run(tmp_path, lambda trainer, loader: try_precision(trainer, loader, "bfloat16", **BF16), model())
    record = callback.result
    assert record.current is None and why in record.untried, record
    assert same(callback.before, callback.after)


def test_a_stretch_set_apart_leaves_the_open_periods_their_peaks_before_it():
    peaks = NestedPeaks()
    peaks.start("train", (0, 0))
    peaks.start("trial", (100, 120))  # the epoch's peak so far, carried; then the counter is reset for the trial
    peaks.drop("trial")  # ... and reset again after it: the trial's own peak reaches no period
    assert peaks.read("train", (40, 60)) == (100, 120)
    assert peaks.read("trial", (40, 60)) == (40, 60)  # forgotten


class KeepsOutput(Logged):
    """Keeps its last loss, graph and all, as a torchmetrics loss keeps its ``_forward_cache``: ``copy.deepcopy``
    refuses such a tensor."""

    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        self.last = out["loss"] * 1
        return out


def test_a_module_holding_a_graphs_output_is_copied_with_it_detached(tmp_path):
    callback = run(tmp_path, lambda trainer, loader: try_precision(trainer, loader, "bfloat16", **BF16), KeepsOutput())
    assert callback.result.untried is None, callback.result
    assert same(callback.before, callback.after)


class NoIndex(Logged):
    def training_step(self, batch):
        return super().training_step(batch, 0)


def test_a_training_step_without_a_batch_index_is_called_as_lightning_calls_it(tmp_path):
    callback = run(tmp_path, lambda trainer, loader: try_threads(trainer, loader, 2, **TWO), NoIndex())
    assert callback.result.untried is None and callback.result.advised > 0, callback.result
