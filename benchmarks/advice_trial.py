"""
What a DataLoader trial measures, against applying its advice
=============================================================

``dataloader_bound``'s advised DataLoader setting is tried on the run's own data (issue 48:
:mod:`lightning_perf.collect.loader_trial`). This benchmark compares the trial's measured ratio (the step's wait
for a batch, current over advised) with what applying the advice does: a fit with the trial on, then a fit with
the advised ``DataLoader`` arguments and one without them (both with ``try_advice=False``), each of ``--epochs``
epochs, planned as 1000 (so that the advice weighs the workers' start-up over a long run) and stopped early. It
prints the trial's record, and the applied runs' data wait per batch and median epoch over the epochs after the
first. The trial's figure is a step's time per batch over an epoch (its wait and compute): compare it with
the applied step's.

Datasets: ``tests/models.py``'s ``SleepyDataset`` (5 ms a sample, batches of 4: I/O-bound) and in-memory
``TensorDataset`` s of 8192x16 floats at three batch sizes (torch on one thread, so that a CPU is free).

Run it from the repository root::

    python benchmarks/advice_trial.py            # about 1 minute on 2 cores
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from lightning_perf import PerfCallback
from lightning_perf.diagnose.advice_tried import loader_setting
from models import TinyModel, trainer


class StopAfter(pl.Callback):
    def __init__(self, epochs: int) -> None:
        self.epochs = epochs

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if trainer.current_epoch + 1 >= self.epochs:
            trainer.should_stop = True


class InMemory(TinyModel):
    def __init__(self, batch_size: int) -> None:
        super().__init__(batch_size=batch_size)

    def train_dataloader(self):
        x = torch.randn(8192, 16, generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(x, (x.sum(1, keepdim=True) > 0).float()), batch_size=self.batch_size)


def fit(model: TinyModel, epochs: int, setting: dict[str, Any] | None, try_advice: bool) -> tuple[PerfCallback, float]:
    if setting:
        made = model.train_dataloader
        model.train_dataloader = lambda: DataLoader(made().dataset, batch_size=model.batch_size, **setting)
    callback = PerfCallback(profile_budget=None, max_windows=0, verbose=0, try_advice=try_advice)
    with tempfile.TemporaryDirectory() as tmp:
        run = trainer(pathlib.Path(tmp), [callback, StopAfter(epochs)], max_epochs=1000, limit_val_batches=0)
        run.fit(model)
    later = [e for e in callback.epochs if e.stage == "train"][1:]
    batches = max(sum(e.measured_batches for e in later), 1)
    wait, step = sum(e.data_wait for e in later) / batches, sum(e.step_time for e in later) / batches
    return callback, (wait, step, statistics.median(e.wall_time or 0.0 for e in later))


def compare(name: str, make: Callable[[], TinyModel], epochs: int) -> None:
    callback, _ = fit(make(), epochs, None, True)
    record = (callback.report["run"].get("advice_trials") or {}).get("dataloader_bound")
    if not record or record["untried"]:
        print(f"{name}: no trial ({record['untried'] if record else 'no setting advised'})")
        return
    _, (wait_after, step_after, epoch_after) = fit(make(), epochs, loader_setting(record["setting"]), False)
    _, (wait_before, step_before, epoch_before) = fit(make(), epochs, None, False)
    low, high = record["spread"]
    print(
        f"{name}: tried `{record['setting']}`: a step {record['current'] * 1e3:.2f} -> {record['advised'] * 1e3:.2f}"
        f" ms a batch, {record['ratio']:.2f}x ({low:.2f}-{high:.2f}), cost {record['seconds']:.2f} s; applied: step"
        f" {step_before * 1e3:.2f} -> {step_after * 1e3:.2f} ms a batch ({step_before / step_after:.2f}x), wait"
        f" {wait_before * 1e3:.2f} -> {wait_after * 1e3:.2f} ms ({wait_before / max(wait_after, 1e-9):.2f}x), epoch"
        f" {epoch_before:.3f} -> {epoch_after:.3f} s ({epoch_before / epoch_after:.2f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    start = time.perf_counter()
    compare("SleepyDataset 5 ms/sample, batch 4", lambda: TinyModel(n=128, batch_size=4, sleep_s=0.005), args.epochs)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for batch_size in (512, 768, 1024):
            compare(f"TensorDataset, batch {batch_size}, 1 thread", lambda b=batch_size: InMemory(b), args.epochs)
    finally:
        torch.set_num_threads(threads)
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
