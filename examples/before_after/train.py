"""
Before/after: a slow Lightning training run, fixed with PerfCallback's findings
===============================================================================

A small CNN learns scikit-learn's handwritten digits (``load_digits``, shipped inside scikit-learn: no
download) for three epochs on the CPU, with ``PerfCallback()`` at its defaults. The 1,797 8x8 digits are
written once as PNG files (``<root>/digits_png/``, like any image-folder dataset) and upsampled to 32x32.
One script, two configurations:

- ``--config before``: what Lightning users really write. The Dataset opens, decodes, resizes (PIL) and
  augments (random rotation and shift) one image per ``__getitem__``, every epoch again, in the training
  process (``DataLoader(num_workers=0)``); every step logs Python floats (``self.log(..., acc.item(),
  on_step=True, prog_bar=True)``), validation included.
- ``--config after``: what the findings advise. The images are decoded once in ``setup`` and upsampled in
  one tensor operation; the random rotation and shift run on the whole batch (one affine grid, one grid
  sample) in ``on_after_batch_transfer``; batches are sliced out of the in-memory tensors whole; training
  logs tensors, and validation accumulates its loss and accuracy and logs them once per epoch.

Run: ``python examples/before_after/train.py --config before|after --root DIR``. Each run writes to
``<root>/<config>/version_N`` (the TensorBoard logger's version directory, printed at the end), with
``perf/perf_report.json`` and the profiler windows inside it; the findings are printed at every epoch end.
See README.md next to this file for the walk-through with real output.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from PIL import Image
from sklearn.datasets import load_digits
from torch import nn
from torch.nn import functional as F
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, SequentialSampler, TensorDataset

from lightning_perf import PerfCallback

SIZE = 32  # the 8x8 digits are upsampled to SIZE x SIZE
MAX_ANGLE = 10.0  # training augmentation: a random rotation of up to this many degrees ...
MAX_SHIFT = 2  # ... and a random shift of up to this many pixels each way
SEED = 0


def write_pngs(folder: Path) -> None:
    """The digits as ``<folder>/<split>/<label>/<index>.png`` (8x8 grayscale), split 80/20 with a fixed seed.
    Written once; later runs read the same files."""
    if (folder / "done").exists():
        return
    digits = load_digits()
    images = np.round(digits.images * (255 / 16)).astype(np.uint8)
    order = np.random.default_rng(SEED).permutation(len(images))
    cut = int(0.8 * len(images))
    for split, indices in (("train", order[:cut]), ("val", order[cut:])):
        for i in indices:
            path = folder / split / str(digits.target[i]) / f"{i:04d}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(images[i]).save(path)
    (folder / "done").touch()


def list_pngs(folder: Path) -> tuple[list[Path], list[int]]:
    """The PNG files of one split and their labels (the name of the folder they are in), in a fixed order."""
    paths = sorted(folder.glob("*/*.png"))
    return paths, [int(p.parent.name) for p in paths]


# --- before: decode, resize and augment one image per __getitem__ ----------------------------------------


class DigitFiles(Dataset):
    """The usual image-folder Dataset: every item is read, decoded, resized and augmented on its own."""

    def __init__(self, folder: Path, augment: bool) -> None:
        self.paths, self.labels = list_pngs(folder)
        self.augment = augment

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        image = Image.open(self.paths[i]).convert("L").resize((SIZE, SIZE), Image.BILINEAR)
        if self.augment:
            # numpy's global RNG on purpose: `seed_everything(workers=True)` seeds it in each worker, where a
            # Generator made here would be copied, and every worker would draw the same numbers.
            angle = float(np.random.uniform(-MAX_ANGLE, MAX_ANGLE))  # noqa: NPY002
            image = image.rotate(angle, resample=Image.BILINEAR)
        x = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).unsqueeze(0)
        if self.augment:  # random shift: pad, then crop SIZE x SIZE at a random offset
            x = F.pad(x, (MAX_SHIFT,) * 4)
            top, left = np.random.randint(0, 2 * MAX_SHIFT + 1, size=2)  # noqa: NPY002 - as above
            x = x[:, top : top + SIZE, left : left + SIZE]
        return (x - 0.5) / 0.5, self.labels[i]


# --- after: decode and resize once, augment whole batches ---------------------------------------------


def decoded(folder: Path) -> TensorDataset:
    """All images of a split decoded once and upsampled in one call: float (N, 1, SIZE, SIZE), normalized."""
    paths, labels = list_pngs(folder)
    images = torch.from_numpy(np.stack([np.asarray(Image.open(p).convert("L")) for p in paths]))
    x = F.interpolate(images.float().div_(255.0).unsqueeze(1), size=(SIZE, SIZE), mode="bilinear")
    return TensorDataset((x - 0.5) / 0.5, torch.tensor(labels))


def augment_batch(x: torch.Tensor) -> torch.Tensor:
    """A random rotation and shift per image of a batch (N, C, H, W): one affine grid, one grid sample."""
    n = x.shape[0]
    angle = (torch.rand(n) * 2 - 1) * math.radians(MAX_ANGLE)
    shift = torch.randint(-MAX_SHIFT, MAX_SHIFT + 1, (n, 2)) * (2 / x.shape[-1])  # pixels -> grid units
    cos, sin = angle.cos(), angle.sin()
    theta = torch.stack([torch.stack([cos, -sin, shift[:, 0]], 1), torch.stack([sin, cos, shift[:, 1]], 1)], 1)
    grid = F.affine_grid(theta.to(x), list(x.shape), align_corners=False)
    # The normalized background is -1: sample x + 1 so that what comes in at the borders is background.
    return F.grid_sample(x + 1, grid, mode="bilinear", padding_mode="zeros", align_corners=False) - 1


class DigitsData(pl.LightningDataModule):
    def __init__(self, config: str, root: str, batch_size: int = 32, num_workers: int = 0) -> None:
        super().__init__()
        self.config, self.folder = config, Path(root) / "digits_png"
        self.batch_size, self.num_workers = batch_size, num_workers

    def prepare_data(self) -> None:
        write_pngs(self.folder)

    def setup(self, stage: str) -> None:
        if self.config == "before":
            self.train = DigitFiles(self.folder / "train", augment=True)
            self.val = DigitFiles(self.folder / "val", augment=False)
        else:
            self.train, self.val = decoded(self.folder / "train"), decoded(self.folder / "val")

    def loader(self, dataset: Dataset, shuffle: bool) -> DataLoader:
        workers = {"num_workers": self.num_workers, "persistent_workers": self.num_workers > 0}
        if self.config == "before":
            return DataLoader(dataset, batch_size=self.batch_size, shuffle=shuffle, **workers)
        # In-memory tensors: one index per batch (a TensorDataset takes a list of indices) instead of one
        # __getitem__ per sample and a collate of 32 small tensors.
        order = RandomSampler(dataset) if shuffle else SequentialSampler(dataset)
        batches = BatchSampler(order, self.batch_size, drop_last=False)
        return DataLoader(dataset, sampler=batches, batch_size=None, **workers)

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
        return augment_batch(x), y

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        loss = F.cross_entropy(logits, y)
        acc = (logits.argmax(dim=1) == y).float().mean()
        if self.before:  # Python floats: a device sync per value on a GPU
            self.log("train_loss", loss.item(), on_step=True, prog_bar=True)
            self.log("train_acc", acc.item(), on_step=True, prog_bar=True)
        else:  # tensors: Lightning reads them only when it writes to the logger
            self.log("train_loss", loss, prog_bar=True)
            self.log("train_acc", acc, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        loss = F.cross_entropy(logits, y)
        if self.before:  # two self.log calls per validation batch, each a Python float
            self.log("val_loss", loss.item(), prog_bar=True)
            self.log("val_acc", (logits.argmax(dim=1) == y).float().mean().item(), prog_bar=True)
        else:  # accumulated in a tensor, logged once per validation run
            correct = (logits.argmax(dim=1) == y).sum()
            self.val_sums += torch.stack([loss * len(y), correct.float(), loss.new_tensor(len(y))])
        return loss

    def on_validation_epoch_start(self) -> None:
        self.val_sums = torch.zeros(3, device=self.device)  # after: loss sum, correct, samples

    def on_validation_epoch_end(self) -> None:
        if not self.before:
            loss_sum, correct, samples = self.val_sums
            self.log("val_loss", loss_sum / samples, prog_bar=True)
            self.log("val_acc", correct / samples, prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def main(argv: list[str] | None = None) -> PerfCallback:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    parser.add_argument("--config", choices=["before", "after"], required=True)
    parser.add_argument("--root", default="before_after_logs", help="runs go to <root>/<config>/version_N")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader workers (persistent when > 0)")
    args = parser.parse_args(argv)

    pl.seed_everything(SEED, workers=True, verbose=False)
    perf = PerfCallback()
    trainer = pl.Trainer(
        logger=TensorBoardLogger(args.root, name=args.config),
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=1,
        callbacks=[perf],
        enable_progress_bar=False,  # keeps the console to PerfCallback's lines
        enable_model_summary=False,
        log_every_n_steps=10,
    )
    data = DigitsData(args.config, args.root, num_workers=args.num_workers)
    start = time.perf_counter()
    trainer.fit(DigitsCNN(args.config), datamodule=data)
    elapsed = time.perf_counter() - start

    val_acc = trainer.callback_metrics.get("val_acc")
    print()
    accuracy = f", val_acc {val_acc:.3f}" if val_acc is not None else ""
    print(f"{args.config}: trainer.fit took {elapsed:.1f} s{accuracy}")
    header = f"{'stage':<9}{'epoch':>5}{'batches':>9}{'step p50':>10}{'p90':>9}{'data wait':>12}{'samples/s':>11}"
    print(f"  {header}  findings")
    for e in perf.epochs:  # data wait rounded down, as in the findings' titles
        throughput = f"{e.throughput:,.0f}" if e.throughput else "-"
        found = ", ".join(f"{f.id} ({f.severity})" for f in perf.findings_for(e.stage, epoch=e.epoch)) or "-"
        print(
            f"  {e.stage:<9}{e.epoch:>5}{e.batches:>9}{e.step_time_p50 * 1e3:>8.2f}ms{e.step_time_p90 * 1e3:>7.2f}ms"
            f"{math.floor(e.data_wait_fraction * 100):>10}%{throughput:>11}  {found}"
        )
    print(f"Run directory: {os.path.abspath(trainer.logger.log_dir)}")
    return perf


if __name__ == "__main__":
    main()
