"""
Per-batch hook cost
===================

What ``PerfCallback`` adds to every batch outside its profiler windows, timed directly: its
``on_train_batch_start`` and ``on_train_batch_end`` hooks, and the four hooks that mark a training batch's phases
(``on_before_zero_grad``, ``on_before_backward``, ``on_after_backward``, ``on_before_optimizer_step``), called in
a tight loop on a real, set-up Trainer, with no model work around them (the optimizer's step post-hook, one more
call, is not in it). Unlike ``overhead.py``, whose whole-step ratios move by several % from
round to round on a shared machine, this isolates the callback's own cost (a few microseconds).

Run it from the repository root::

    python benchmarks/hook_cost.py [--batches 20000]

It prints microseconds per batch with the scalars logged every batch, every 50 batches (Lightning's
default ``log_every_n_steps``), and never; compare them with your step time. "Every batch" is as the callback's
pace allows (:mod:`lightning_perf.hooks.log_pace`: 1% of the wall time, after a first 10 ms); in this tight loop
that is a few writes, so it reads close to "never". ``log_cadence.py`` times whole fits at a fine cadence.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
import warnings

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_perf import PerfCallback


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(16, 1)

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(8, 16)), batch_size=4)


def hook_cost(log_every_n_steps: int, batches: int, phases: bool = True) -> float:
    """Seconds per batch spent in PerfCallback's per-batch hooks: the batch's start and end, and (``phases``) the
    four marks of a training batch's phases (zero_grad, backward's start and end, the optimizer step)."""
    perf = PerfCallback(max_windows=0)  # the cost outside windows: no window ever opens
    with tempfile.TemporaryDirectory() as root:
        trainer = pl.Trainer(
            default_root_dir=root,
            accelerator="cpu",
            max_epochs=1,
            callbacks=[perf],
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
            log_every_n_steps=log_every_n_steps,
        )
        model = Tiny()
        trainer.fit(model)
        perf.on_train_epoch_start(trainer, model)
        perf._positions["train"].num_batches = float("inf")  # keep the loop inside one endless epoch
        batch = (torch.randn(64, 16), torch.randn(64, 1))
        outputs = {"loss": torch.tensor(0.5)}
        start = time.perf_counter()
        optimizer, loss = trainer.optimizers[0], outputs["loss"]
        for i in range(batches):
            perf.on_train_batch_start(trainer, model, batch, i)
            if phases:
                perf.on_before_zero_grad(trainer, model, optimizer)
                perf.on_before_backward(trainer, model, loss)
                perf.on_after_backward(trainer, model)
                perf.on_before_optimizer_step(trainer, model, optimizer)
            perf.on_train_batch_end(trainer, model, outputs, batch, i)
        elapsed = (time.perf_counter() - start) / batches
        perf.teardown(trainer, model, "fit")  # closes the event file it reopened, before the directory goes
        return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description="PerfCallback's per-batch hook cost outside windows.")
    parser.add_argument("--batches", type=int, default=20000)
    args = parser.parse_args()
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore")
    print(f"torch {torch.__version__}, lightning {pl.__version__}")
    for label, every in (("scalars every batch", 1), ("scalars every 50 batches (default)", 50), ("no scalars", 10**9)):
        print(f"  {label:<36} {hook_cost(every, args.batches) * 1e6:7.2f} us per batch")
    without = hook_cost(50, args.batches, phases=False)
    print(f"  {'default, without the phase marks':<36} {without * 1e6:7.2f} us per batch")


if __name__ == "__main__":
    main()
