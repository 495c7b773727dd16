"""
Before/after: fixing a slow Lightning training run with PerfCallback's findings
===============================================================================

A small CNN learns scikit-learn's handwritten digits (``load_digits``, shipped inside scikit-learn: no
download), upsampled from 8x8 to 32x32, for three epochs on the CPU, with ``PerfCallback()`` at its
defaults. One script, two configurations:

- ``--config before``: settings Lightning users really write. Each ``__getitem__`` converts one 8x8 image
  to a PIL image, resizes it to 32x32, rotates it by a random angle and converts it back to a normalized
  tensor; ``DataLoader(num_workers=0)``; ``self.log(..., acc.item(), on_step=True, prog_bar=True)`` every
  step; ``Adam(..., foreach=False)``.
- ``--config after``: what the findings advise. The resize is done once, for the whole dataset, in
  ``setup``; the random rotation runs on the whole batch as two tensor operations in
  ``on_after_batch_transfer``; ``self.log`` gets tensors (Lightning reduces them at its logging cadence);
  ``Adam(..., foreach=True)``.

Run: ``python examples/before_after/train.py --config before|after [--root DIR]``. Each run writes to
``<root>/<config>/version_N`` (the TensorBoard logger's version directory, printed at the end), with
``perf/perf_report.json`` and the profiler windows inside it; the findings are printed at every epoch end.
See README.md next to this file for the walk-through with real output.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from PIL import Image
from sklearn.datasets import load_digits
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset

from lightning_perf import PerfCallback

SIZE = 32  # the 8x8 digits are upsampled to SIZE x SIZE
MAX_ANGLE = 10.0  # random rotation of training images, in degrees
SEED = 0


def digits_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The 1,797 digit images as uint8 8x8 arrays (0-255) and their labels, split 80/20 with a fixed seed."""
    digits = load_digits()
    images = np.round(digits.images * (255 / 16)).astype(np.uint8)
    order = np.random.default_rng(SEED).permutation(len(images))
    cut = int(0.8 * len(images))
    train, val = order[:cut], order[cut:]
    return images[train], digits.target[train], images[val], digits.target[val]


# --- before: a per-item transform in __getitem__ --------------------------------------------------------


class DigitsImages(Dataset):
    """The usual image Dataset: every item is converted, resized and augmented on its own, each time."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, augment: bool) -> None:
        self.images, self.labels, self.augment = images, labels, augment

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        image = Image.fromarray(self.images[i]).resize((SIZE, SIZE), Image.BILINEAR)
        if self.augment:
            image = image.rotate(float(np.random.uniform(-MAX_ANGLE, MAX_ANGLE)), resample=Image.BILINEAR)
        x = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).unsqueeze(0)
        x = (x - 0.5) / 0.5
        return x, int(self.labels[i])


# --- after: the resize once, the augmentation on whole batches ------------------------------------------


def upsampled(images: np.ndarray) -> torch.Tensor:
    """All images at once: uint8 (N, 8, 8) -> normalized float (N, 1, SIZE, SIZE)."""
    x = torch.from_numpy(images).float().div_(255.0).unsqueeze(1)
    x = F.interpolate(x, size=(SIZE, SIZE), mode="bilinear", align_corners=False)
    return (x - 0.5) / 0.5


def rotate_batch(x: torch.Tensor, max_angle: float) -> torch.Tensor:
    """A random rotation per image of a batch (N, C, H, W), as one affine grid and one grid sample."""
    angles = (torch.rand(x.shape[0], device=x.device) * 2 - 1) * math.radians(max_angle)
    cos, sin, zero = angles.cos(), angles.sin(), torch.zeros_like(angles)
    theta = torch.stack([torch.stack([cos, -sin, zero], 1), torch.stack([sin, cos, zero], 1)], 1)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    # The background of the normalized images is -1: rotate x + 1 so that the corners fill with it.
    return F.grid_sample(x + 1, grid, mode="bilinear", padding_mode="zeros", align_corners=False) - 1


class DigitsData(pl.LightningDataModule):
    def __init__(self, config: str, batch_size: int = 32, num_workers: int = 0) -> None:
        super().__init__()
        self.config, self.batch_size, self.num_workers = config, batch_size, num_workers

    def setup(self, stage: str) -> None:
        x_train, y_train, x_val, y_val = digits_split()
        if self.config == "before":
            self.train = DigitsImages(x_train, y_train, augment=True)
            self.val = DigitsImages(x_val, y_val, augment=False)
        else:
            self.train = TensorDataset(upsampled(x_train), torch.from_numpy(y_train).long())
            self.val = TensorDataset(upsampled(x_val), torch.from_numpy(y_val).long())

    def loader(self, dataset: Dataset, shuffle: bool) -> DataLoader:
        workers = self.num_workers
        return DataLoader(
            dataset, batch_size=self.batch_size, shuffle=shuffle, num_workers=workers, persistent_workers=workers > 0
        )

    def train_dataloader(self) -> DataLoader:
        return self.loader(self.train, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self.loader(self.val, shuffle=False)


class DigitsCNN(pl.LightningModule):
    def __init__(self, config: str, lr: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),  # 16x16
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),  # 8x8
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),  # 4x4
            nn.Flatten(), nn.Linear(64 * 4 * 4, 128), nn.ReLU(), nn.Linear(128, 10),
        )  # fmt: skip

    @property
    def before(self) -> bool:
        return self.hparams.config == "before"

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        if self.before or not self.trainer.training:
            return batch
        x, y = batch
        return rotate_batch(x, MAX_ANGLE), y

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        loss = F.cross_entropy(logits, y)
        acc = (logits.argmax(dim=1) == y).float().mean()
        if self.before:  # a Python float per step: a sync on a GPU, and Lightning logs it every step
            self.log("train_loss", loss.item(), on_step=True, prog_bar=True)
            self.log("train_acc", acc.item(), on_step=True, prog_bar=True)
        else:  # tensors: Lightning reads them only at its logging cadence
            self.log("train_loss", loss, prog_bar=True)
            self.log("train_acc", acc, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        self.log("val_loss", F.cross_entropy(logits, y), prog_bar=True)
        self.log("val_acc", (logits.argmax(dim=1) == y).float().mean(), prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr, foreach=not self.before)


def main(argv: list[str] | None = None) -> PerfCallback:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    parser.add_argument("--config", choices=["before", "after"], required=True)
    parser.add_argument("--root", default="before_after_logs", help="runs go to <root>/<config>/version_N")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--num-workers", type=int, default=None, help="DataLoader workers (default: 0 for both)")
    args = parser.parse_args(argv)

    pl.seed_everything(SEED, workers=True, verbose=False)
    workers = 0 if args.num_workers is None else args.num_workers
    perf = PerfCallback()
    trainer = pl.Trainer(
        logger=TensorBoardLogger(args.root, name=args.config),
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=1,
        callbacks=[perf],
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=10,
    )
    start = time.perf_counter()
    trainer.fit(DigitsCNN(args.config), datamodule=DigitsData(args.config, num_workers=workers))
    elapsed = time.perf_counter() - start

    print()
    print(f"{args.config}: {elapsed:.1f} s for trainer.fit, val_acc {trainer.callback_metrics['val_acc']:.3f}")
    print(f"  {'stage':<9}{'epoch':>5}{'batches':>9}{'step p50':>10}{'p90':>9}{'data wait':>11}{'samples/s':>11}  findings")
    for e in perf.epochs:
        throughput = f"{e.throughput:,.0f}" if e.throughput else "-"
        found = ", ".join(f"{f.id} ({f.severity})" for f in perf.findings_for(e.stage, epoch=e.epoch)) or "-"
        print(
            f"  {e.stage:<9}{e.epoch:>5}{e.batches:>9}{e.step_time_p50 * 1e3:>8.2f}ms{e.step_time_p90 * 1e3:>7.2f}ms"
            f"{e.data_wait_fraction:>10.0%}{throughput:>11}  {found}"
        )
    print(f"Run directory: {os.path.abspath(trainer.logger.log_dir)}")
    return perf


if __name__ == "__main__":
    main()
