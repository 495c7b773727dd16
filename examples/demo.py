"""
lightning-perf demo
===================

A real, small training run with ``PerfCallback()`` at its defaults: an MLP learns scikit-learn's
handwritten digits (``load_digits``, shipped inside scikit-learn: no download) for three epochs on the CPU.

Run it with ``make demo`` (sets everything up), or ``python examples/demo.py [--root DIR] [--epochs N]``.
It ends by printing the windows it recorded, where their traces are, and the ``tensorboard`` command that
shows them.
"""

from __future__ import annotations

import argparse
import os

import lightning.pytorch as pl
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, random_split

from lightning_perf import PerfCallback


class DigitsData(pl.LightningDataModule):
    """The 1,797 8x8 digit images of scikit-learn, split 80/20, as in-memory tensors."""

    def __init__(self, batch_size: int = 32) -> None:
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str) -> None:
        digits = load_digits()
        x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
        y = torch.tensor(digits.target, dtype=torch.long)
        self.train, self.val = random_split(TensorDataset(x, y), [0.8, 0.2], generator=torch.Generator().manual_seed(0))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=self.batch_size)


class DigitsClassifier(pl.LightningModule):
    def __init__(self, hidden: int = 128, lr: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        self.log("val_loss", nn.functional.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(dim=1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def main(argv: list[str] | None = None) -> PerfCallback:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    parser.add_argument("--root", default="demo_logs", help="the Trainer's default_root_dir")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args(argv)

    pl.seed_everything(0, verbose=False)
    perf = PerfCallback()
    trainer = pl.Trainer(
        default_root_dir=args.root,
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=1,
        callbacks=[perf],
        enable_progress_bar=False,
        log_every_n_steps=10,
    )
    trainer.fit(DigitsClassifier(), datamodule=DigitsData())

    print()
    print("lightning-perf, per stage and epoch (every batch measured, no profiler):")
    print(
        f"  {'stage':<9}{'epoch':>5}{'batches':>9}{'step p50':>10}{'p90':>9}"
        f"{'data wait':>11}{'samples/s':>11}{'loss':>8}"
    )
    for e in perf.epochs:
        throughput = f"{e.throughput:,.0f}" if e.throughput else "-"
        loss = f"{e.loss:.3f}" if e.loss is not None else "-"
        print(
            f"  {e.stage:<9}{e.epoch:>5}{e.batches:>9}{e.step_time_p50 * 1e3:>8.2f}ms{e.step_time_p90 * 1e3:>7.2f}ms"
            f"{e.data_wait_fraction:>10.0%}{throughput:>11}{loss:>8}"
        )
    print(f"and {len(perf.windows)} profiler window(s):")
    for window in perf.windows:
        top = max(window.operators, key=lambda op: op.self_cpu_time)
        print(
            f"  {window.name:<38} {window.num_batches} batch(es), top operator by self CPU time:"
            f" {top.name} ({top.self_cpu_time / 1000:.2f} ms)"
        )
    print(f"Traces, operator tables and perf_report.json: {os.path.abspath(perf.dirpath)}")
    final = {stage: perf.findings_for(stage, epoch=args.epochs - 1) for stage in ("train", "validate")}
    print("Findings of the last epoch (each printed above at its epoch's end, with advice):")
    for stage, findings in final.items():
        names = ", ".join(f"{f.id} ({f.severity})" for f in findings) or "no bottleneck found"
        print(f"  {stage}: {names}")
    print(f"The run's report, one page that opens offline in any browser: {os.path.abspath(perf.page_path)}")
    print(f"Open them: tensorboard --logdir {os.path.abspath(perf.tensorboard_logdir)}")
    return perf


if __name__ == "__main__":
    main()
